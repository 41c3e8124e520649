/**
 * The files a snapshot's chain is made of on this node, with their sizes and sha256: the one way
 * packs (pack.ts stagePack), the peer manifest (peer-manifest.ts) and the peer blob index
 * (held-files.ts) list them.
 *
 * Each snapshot's own files are its memory image (a diff snapshot's memory.diff instead: its
 * base's image belongs to the base), its device state and its disk layer, with the sums its
 * metadata records (sealed with them), and its meta.json as it is now (hashed: FileSums). The
 * guest image's four files are those of the root's image directory, with the sums its
 * manifest.json records where those are to be believed, else hashed once (FileSums).
 */
import { join } from "node:path";
import { IMAGE_FILES, recordedImageSums } from "../image/index.js";
import type { ImageFile } from "../image/index.js";
import { ForkdError } from "../util/index.js";
import type { FileSum, FileSums } from "./file-sums.js";
import type { SnapshotMeta } from "./meta.js";
import type { SnapshotStore } from "./store.js";

/** A snapshot's own files, in the order packs list them. */
export const OWN_FILES = ["memory", "memory.diff", "vmstate", "disk.qcow2", "meta.json"] as const;
export type OwnFile = (typeof OWN_FILES)[number];

/** A file this node holds: where it is, and its size and sha256. */
export interface HeldFile extends FileSum {
  src: string;
}

/** The chain of `key`, root first (at most 64 deep; a diff's memory base among its ancestors). */
export async function chainOf(store: SnapshotStore, key: string): Promise<SnapshotMeta[]> {
  const out: SnapshotMeta[] = [];
  for (let t: string | undefined = key; t;) {
    const m: SnapshotMeta = (await store.get(t)).meta;
    out.unshift(m);
    if (out.length > 64) throw new ForkdError("snapshot_corrupt", `chain of ${key} is deeper than 64`);
    t = m.parent?.tag;
  }
  // A diff's memory base is an ancestor (chain.ts keeps it so): a pull or a pack carries its image.
  for (const [i, m] of out.entries()) {
    if (m.memoryBase && !out.slice(0, i).some((a) => a.tag === m.memoryBase?.tag))
      throw new ForkdError("snapshot_corrupt", `snapshot ${m.tag}: its memory base is not in its chain`);
  }
  return out;
}

/** `meta`'s own files (memory or memory.diff, vmstate, disk.qcow2, meta.json), in OWN_FILES order. */
export async function ownFiles(
  store: SnapshotStore,
  meta: SnapshotMeta,
  sums: FileSums,
): Promise<Map<OwnFile, HeldFile>> {
  const dir = store.filesFor(meta.tag).dir;
  const out = new Map<OwnFile, HeldFile>();
  const put = (f: OwnFile, s: FileSum) => out.set(f, { src: join(dir, f), size: s.size, sha256: s.sha256 });
  if (meta.files.memoryDiff) put("memory.diff", meta.files.memoryDiff);
  else put("memory", meta.files.memory);
  put("vmstate", meta.files.vmstate);
  put("disk.qcow2", meta.files.disk);
  put("meta.json", await sums.of(join(dir, "meta.json")));
  return out;
}

/**
 * The four files of the guest image in `dir`, in IMAGE_FILES order, with the sums its
 * manifest.json records when they are to be believed (image/content.ts recordedImageSums: no
 * hashing of a root filesystem of some GiB), else hashed.
 */
export async function imageFiles(dir: string, sums: FileSums): Promise<Map<ImageFile, HeldFile>> {
  const recorded = await recordedImageSums(dir);
  const out = new Map<ImageFile, HeldFile>();
  for (const f of IMAGE_FILES) {
    const src = join(dir, f);
    const r = recorded?.[f];
    out.set(f, { src, ...(r ? { size: r.size, sha256: r.sha256 } : await sums.of(src)) });
  }
  return out;
}

export interface ChainListing {
  /** The chain, root first. */
  chain: SnapshotMeta[];
  /** The guest image every snapshot of the chain boots. */
  image: Map<ImageFile, HeldFile>;
  /** Each snapshot's own files, in the chain's order. */
  own: Map<OwnFile, HeldFile>[];
}

/** Every file of `key`'s chain and its guest image, as this node holds them. */
export async function listChain(store: SnapshotStore, key: string, sums: FileSums): Promise<ChainListing> {
  const chain = await chainOf(store, key);
  const root = chain[0] as SnapshotMeta;
  if (chain.some((m) => m.image.dir !== root.image.dir))
    throw new ForkdError("snapshot_corrupt", `chain of ${key} mixes guest images`);
  const own: Map<OwnFile, HeldFile>[] = [];
  for (const m of chain) own.push(await ownFiles(store, m, sums));
  return { chain, image: await imageFiles(root.image.dir, sums), own };
}
