/**
 * The snapshot artifact format: manifests a registry hands us are checked before any download
 * (media types, layer paths, sizes, agreement with the config), and blobs decompress to exactly
 * the listed size, sparse, or not at all.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { createReadStream } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { Readable } from "node:stream";
import {
  ANNOTATION,
  MEDIA,
  buildManifest,
  checkLayersAgainst,
  parseManifest,
} from "../../src/snapshot/artifact.js";
import type { PackManifest } from "../../src/snapshot/pack.js";
import { BlobCache, decompressTo } from "../../src/snapshot/blobs.js";
import { ForkdError } from "../../src/util/errors.js";

const sha = (c: string) => c.repeat(64);
const pack: PackManifest = {
  format: "forkd-pack/1",
  created: "2026-01-01T00:00:00.000Z",
  tag: "t1",
  chain: ["t1"],
  image: { hash: sha("a"), template: "python", kernelVersion: "6" },
  files: {
    "image/vmlinuz": { size: 10, sha256: sha("b") },
    "snapshots/t1/memory": { size: 4096, sha256: sha("c") },
  },
};
const blobs = new Map([
  ["image/vmlinuz", { digest: `sha256:${sha("d")}`, size: 20 }],
  ["snapshots/t1/memory", { digest: `sha256:${sha("e")}`, size: 30 }],
]);
const config = { digest: `sha256:${sha("f")}`, size: 100 };
const good = () => JSON.parse(buildManifest(pack, config, blobs).toString()) as Record<string, unknown>;
const enc = (o: unknown) => Buffer.from(JSON.stringify(o));
const refused = (f: () => unknown, re: RegExp) =>
  assert.throws(
    f,
    (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument" && re.test(e.message),
  );

test("a pushed manifest reads back, and agrees with its config", () => {
  const m = parseManifest(buildManifest(pack, config, blobs), MEDIA.manifest);
  assert.equal(m.artifactType, MEDIA.artifact);
  assert.deepEqual(
    m.layers.map((l) => [l.annotations[ANNOTATION.path], l.digest]),
    [...blobs].map(([p, b]) => [p, b.digest]),
  );
  checkLayersAgainst(m, pack);
});

test("manifests that are not ours, or that would write elsewhere, are refused before any download", () => {
  const layer0 = () => (good().layers as Record<string, unknown>[])[0] as Record<string, unknown>;
  const withLayer = (patch: (l: Record<string, unknown>) => void) => {
    const m = good();
    const l = layer0();
    patch(l);
    m.layers = [l, (good().layers as unknown[])[1]];
    return enc(m);
  };
  const setPath = (p: string) =>
    withLayer((l) => {
      l.annotations = { ...(l.annotations as object), [ANNOTATION.path]: p };
    });
  refused(
    () => parseManifest(enc(good()), "application/vnd.docker.distribution.manifest.v2+json"),
    /media type/,
  );
  refused(() => parseManifest(enc({ ...good(), artifactType: "application/vnd.other" }), ""), /artifactType/);
  refused(
    () => parseManifest(enc({ ...good(), config: { ...config, mediaType: "application/json" } }), ""),
    /config/,
  );
  refused(
    () =>
      parseManifest(
        withLayer((l) => (l.mediaType = "application/x-tar")),
        "",
      ),
    /mediaType/,
  );
  for (const p of [
    "../../etc/cron.d/x",
    "/etc/passwd",
    "snapshots/../../x/memory",
    "snapshots/t1/evil.sh",
    "image/../manifest.json",
    "manifest.json",
    "snapshots/-x/memory",
    "image/vmlinuz/",
  ]) {
    refused(() => parseManifest(setPath(p), ""), /layer path/);
  }
  refused(() => parseManifest(setPath("snapshots/t1/memory"), ""), /two layers/);
  refused(
    () =>
      parseManifest(
        withLayer((l) => (l.size = 1e12)),
        "",
      ),
    /larger than its content/,
  );
  refused(
    () =>
      parseManifest(
        withLayer((l) => (l.digest = "sha256:xyz")),
        "",
      ),
    /digest/,
  );
  refused(() => parseManifest(Buffer.alloc(5 << 20, 0x20), ""), /too large/);
  refused(() => parseManifest(Buffer.from("{nope"), ""), /not JSON/);
  // Layers and config must list the same files with the same sums.
  const m = parseManifest(buildManifest(pack, config, blobs), "");
  refused(
    () =>
      checkLayersAgainst(m, {
        ...pack,
        files: { ...pack.files, "snapshots/t1/memory": { size: 4096, sha256: sha("0") } },
      }),
    /does not match the config/,
  );
  refused(
    () => checkLayersAgainst(m, { ...pack, files: { "image/vmlinuz": { size: 10, sha256: sha("b") } } }),
    /different files/,
  );
});

test("blobs: deterministic compression, cached digests; decompression is exact, sparse and bounded", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-blobs-"));
  const sh = promisify(execFile);
  try {
    // 8 MiB, mostly a hole, with some data in the middle.
    const src = join(dir, "memory");
    await sh("truncate", ["-s", "8M", src]);
    await sh("dd", ["if=/dev/urandom", `of=${src}`, "bs=4096", "count=16", "seek=1000", "conv=notrunc"]);
    const { stdout } = await sh("sha256sum", [src]);
    const sum = { sha256: stdout.slice(0, 64), size: 8 << 20 };
    const cache = new BlobCache(join(dir, "cache"));
    assert.equal(await cache.lookup(sum.sha256, sum.size), null);
    const a = await cache.compress(src, sum, join(dir, "a.zst"));
    const b = await cache.compress(src, sum, join(dir, "b.zst"));
    assert.equal(a.digest, b.digest, "same file, same blob");
    assert.deepEqual(await readFile(join(dir, "a.zst")), await readFile(join(dir, "b.zst")));
    assert.equal((await cache.lookup(sum.sha256, sum.size))?.digest, a.digest);
    assert.equal(await cache.lookup(sum.sha256, sum.size + 1), null, "a size mismatch is no hit");

    const out = join(dir, "out");
    await decompressTo(createReadStream(join(dir, "a.zst")), out, sum.size);
    assert.deepEqual(await readFile(out), await readFile(src));
    assert.ok((await stat(out)).blocks * 512 < 1 << 20, "zero runs are holes");

    // Claiming less than it holds (a bomb), more, or not zstd at all: refused, file incomplete.
    const cases: Array<[string, number, RegExp]> = [
      ["a.zst", sum.size - 1, /more than/],
      ["a.zst", sum.size + 1, /decompresses to 8388608 bytes/],
      ["memory", 100, /not a valid zstd blob|more than/],
    ];
    for (const [i, [file, size, re]] of cases.entries()) {
      await assert.rejects(
        decompressTo(createReadStream(join(dir, file)), join(dir, `bad${i}`), size),
        (e: unknown) => e instanceof ForkdError && re.test(e.message),
        `${file} as ${size}`,
      );
    }
    // Small blobs (zstd is done before the output file is open): all of their bytes arrive.
    const tiny = join(dir, "tiny");
    await sh("sh", ["-c", `printf 'forkd %.0s' $(seq 1 40) > ${tiny}; zstd -q -f ${tiny} -o ${tiny}.zst`]);
    for (let i = 0; i < 10; i++) {
      await decompressTo(createReadStream(`${tiny}.zst`), join(dir, `tiny${i}`), 240);
      assert.deepEqual(await readFile(join(dir, `tiny${i}`)), await readFile(tiny));
    }
    // A blob stream that fails at once (a small blob with the wrong digest): the error is the
    // result, not an unhandled event or rejection.
    const failing = new Readable({
      read() {
        this.destroy(new ForkdError("invalid_argument", "blob does not match its digest"));
      },
    });
    await assert.rejects(decompressTo(failing, join(dir, "failing"), 10), /does not match its digest/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
