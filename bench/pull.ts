/**
 * Image pull benchmark: pull + flatten throughput of the Debian test image (the cached
 * debootstrap tree, one zstd layer; the busybox image when there is none) from a loopback
 * registry, no VM. Per sample: a cold pull into an empty cache (fetch + decompress + verify,
 * then flatten), a flatten from cached layers (the rootfs removed), and a cache hit
 * (bench/pull-measure.ts; bench/image.ts runs the same beside its VM figures).
 *
 *   node dist/bench/pull.js [--samples 3] [--json-out FILE]
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { busyboxTar, pushDebianImage, pushImage } from "../test/helpers/oci-images.js";
import { startRegistry } from "../test/helpers/registry.js";
import { measurePull, pullTable } from "./pull-measure.js";

const { values: args } = parseArgs({
  options: { samples: { type: "string", default: "3" }, "json-out": { type: "string" } },
});

const work = await mkdtemp(join(tmpdir(), "forkd-bench-pull-"));
const reg = await startRegistry(work);
try {
  const img =
    (await pushDebianImage(reg.host)) ??
    (await pushImage(reg.host, "forkd-bench/busybox", "latest", [
      { tar: busyboxTar(), compression: "zstd" },
    ]));
  const out = await measurePull(img, Number(args.samples), join(work, "caches"));
  for (const line of pullTable(out)) console.log(line);
  if (args["json-out"]) await writeFile(args["json-out"], JSON.stringify(out, null, 2) + "\n");
} finally {
  await reg.stop();
  await rm(work, { recursive: true, force: true });
}
