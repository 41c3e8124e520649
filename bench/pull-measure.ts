/**
 * The pull + flatten measurement (no VM): an image pulled from a registry by the project's OCI
 * puller. Per sample: a cold pull into an empty cache (fetch + decompress + verify, then
 * flatten), a flatten from the cached layers (the rootfs removed), and a cache hit. Used by
 * bench/pull.ts and bench/image.ts.
 */
import { mkdir, rm, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import { ImagePuller } from "../src/oci/puller.js";
import type { PushedImage } from "../test/helpers/oci-images.js";

const MiB = 2 ** 20;
/** The median (of an even count: the mean of the middle two). */
const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length === 0 ? NaN : s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

export interface PullRow {
  pullS: number;
  flattenS: number;
  flattenCachedS: number;
  hitMs: number;
  layerMiB: number;
  treeMiB: number;
}

export interface PullResult {
  image: string;
  compressed_mib: number;
  uncompressed_mib: number;
  tree_mib: number;
  samples: number;
  pull_s: number;
  pull_mib_s_compressed: number;
  pull_mib_s_uncompressed: number;
  flatten_s: number;
  flatten_mib_s: number;
  flatten_from_cached_layers_s: number;
  cache_hit_ms: number;
  rows: PullRow[];
}

/** `samples` cold pulls of `img` (one layer measured: its first) into caches under `work`. */
export async function measurePull(img: PushedImage, samples: number, work: string): Promise<PullResult> {
  const compressed = img.layers.reduce((a, l) => a + l.size, 0);
  const settings = {
    credentials: () => Promise.resolve(null),
    insecureHosts: [],
    chunkBytes: 64 * MiB,
    idleMs: 60_000,
  };
  await mkdir(work, { recursive: true });
  const rows: PullRow[] = [];
  for (let i = 0; i < samples; i++) {
    const cacheDir = join(work, `cache-${i}`);
    try {
      const p = new ImagePuller({ cacheDir, settings });
      const t0 = performance.now();
      let tFlatten = 0;
      const r = await p.ensure(img.ref, (_m, d) => {
        if (d?.phase === "flatten" && tFlatten === 0) tFlatten = performance.now();
      });
      const t1 = performance.now();
      const layerBytes = (
        await stat(join(p.dir, "layers", "sha256", `${img.layers[0]?.diffId.slice(7)}.tar`))
      ).size;
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
    } finally {
      await rm(cacheDir, { recursive: true, force: true });
    }
  }
  const m = (k: keyof PullRow) => median(rows.map((r) => r[k]));
  return {
    image: img.ref,
    compressed_mib: compressed / MiB,
    uncompressed_mib: m("layerMiB"),
    tree_mib: m("treeMiB"),
    samples,
    pull_s: m("pullS"),
    pull_mib_s_compressed: compressed / MiB / m("pullS"),
    pull_mib_s_uncompressed: m("layerMiB") / m("pullS"),
    flatten_s: m("flattenS"),
    flatten_mib_s: m("layerMiB") / m("flattenS"),
    flatten_from_cached_layers_s: m("flattenCachedS"),
    cache_hit_ms: m("hitMs"),
    rows,
  };
}

/** The result as a Markdown table (the lines bench/pull.ts has always printed). */
export function pullTable(out: PullResult): string[] {
  return [
    `image ${out.image}: ${out.compressed_mib.toFixed(0)} MiB compressed, ${out.uncompressed_mib.toFixed(0)} MiB of tar, ${out.tree_mib.toFixed(0)} MiB of files`,
    `| p50 of ${out.samples} | |`,
    `|---|---|`,
    `| pull (fetch, decompress, verify) | ${out.pull_s.toFixed(1)} s: ${out.pull_mib_s_compressed.toFixed(0)} MiB/s compressed, ${out.pull_mib_s_uncompressed.toFixed(0)} MiB/s uncompressed |`,
    `| flatten | ${out.flatten_s.toFixed(1)} s: ${out.flatten_mib_s.toFixed(0)} MiB/s of tar |`,
    `| flatten again from cached layers | ${out.flatten_from_cached_layers_s.toFixed(1)} s |`,
    `| cache hit (manifest by tag) | ${out.cache_hit_ms.toFixed(1)} ms |`,
  ];
}
