/**
 * Image pull benchmark: pull + flatten throughput of the Debian test image (the cached
 * debootstrap tree, one zstd layer; the busybox image when there is none) from a loopback
 * registry, no VM. Per sample: a cold pull into an empty cache (fetch + decompress + verify,
 * then flatten), a flatten from cached layers (the rootfs removed), and a cache hit.
 *
 *   node dist/bench/pull.js [--samples 3] [--json-out FILE]
 */
import { mkdtemp, rm, stat } from "node:fs/promises";
import { writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { parseArgs } from "node:util";
import { ImagePuller } from "../src/oci/puller.js";
import { busyboxTar, pushDebianImage, pushImage } from "../test/helpers/oci-images.js";
import { startRegistry } from "../test/helpers/registry.js";

const { values: args } = parseArgs({
  options: { samples: { type: "string", default: "3" }, "json-out": { type: "string" } },
});
const SAMPLES = Number(args.samples);
const MiB = 2 ** 20;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

const work = await mkdtemp(join(tmpdir(), "forkd-bench-pull-"));
const reg = await startRegistry(work);
try {
  const img =
    (await pushDebianImage(reg.host)) ??
    (await pushImage(reg.host, "forkd-bench/busybox", "latest", [
      { tar: busyboxTar(), compression: "zstd" },
    ]));
  const compressed = img.layers.reduce((a, l) => a + l.size, 0);
  const settings = {
    credentials: () => Promise.resolve(null),
    insecureHosts: [],
    chunkBytes: 64 * MiB,
    idleMs: 60_000,
  };
  const rows: {
    pullS: number;
    flattenS: number;
    flattenCachedS: number;
    hitMs: number;
    layerMiB: number;
    treeMiB: number;
  }[] = [];
  for (let i = 0; i < SAMPLES; i++) {
    const cacheDir = join(work, `cache-${i}`);
    const p = new ImagePuller({ cacheDir, settings });
    const t0 = performance.now();
    let tFlatten = 0;
    const r = await p.ensure(img.ref, (_m, d) => {
      if (d?.phase === "flatten" && tFlatten === 0) tFlatten = performance.now();
    });
    const t1 = performance.now();
    const layerBytes = (await stat(join(p.dir, "layers", "sha256", `${img.layers[0]?.diffId.slice(7)}.tar`)))
      .size;
    // Flatten again from the cached layers.
    await rm(dirname(r.rootfs), { recursive: true, force: true });
    const t2 = performance.now();
    await new ImagePuller({ cacheDir, settings }).ensure(img.ref);
    const t3 = performance.now();
    await p.ensure(img.ref);
    const t4 = performance.now();
    rows.push({
      pullS: (tFlatten - t0) / 1000,
      flattenS: (t1 - tFlatten) / 1000,
      flattenCachedS: (t3 - t2) / 1000,
      hitMs: t4 - t3,
      layerMiB: layerBytes / MiB,
      treeMiB: r.sizeBytes / MiB,
    });
    await rm(cacheDir, { recursive: true, force: true });
  }
  const m = (k: keyof (typeof rows)[number]) => median(rows.map((r) => r[k]));
  const out = {
    image: img.ref,
    compressed_mib: compressed / MiB,
    uncompressed_mib: m("layerMiB"),
    tree_mib: m("treeMiB"),
    samples: SAMPLES,
    pull_s: m("pullS"),
    pull_mib_s_compressed: compressed / MiB / m("pullS"),
    pull_mib_s_uncompressed: m("layerMiB") / m("pullS"),
    flatten_s: m("flattenS"),
    flatten_mib_s: m("layerMiB") / m("flattenS"),
    flatten_from_cached_layers_s: m("flattenCachedS"),
    cache_hit_ms: m("hitMs"),
    rows,
  };
  console.log(
    `image ${out.image}: ${out.compressed_mib.toFixed(0)} MiB compressed, ${out.uncompressed_mib.toFixed(0)} MiB of tar, ${out.tree_mib.toFixed(0)} MiB of files`,
  );
  console.log(`| p50 of ${SAMPLES} | |`);
  console.log(`|---|---|`);
  console.log(
    `| pull (fetch, decompress, verify) | ${out.pull_s.toFixed(1)} s: ${out.pull_mib_s_compressed.toFixed(0)} MiB/s compressed, ${out.pull_mib_s_uncompressed.toFixed(0)} MiB/s uncompressed |`,
  );
  console.log(`| flatten | ${out.flatten_s.toFixed(1)} s: ${out.flatten_mib_s.toFixed(0)} MiB/s of tar |`);
  console.log(`| flatten again from cached layers | ${out.flatten_from_cached_layers_s.toFixed(1)} s |`);
  console.log(`| cache hit (manifest by tag) | ${out.cache_hit_ms.toFixed(1)} ms |`);
  if (args["json-out"]) await writeFile(args["json-out"], JSON.stringify(out, null, 2) + "\n");
} finally {
  await reg.stop();
  await rm(work, { recursive: true, force: true });
}
