/**
 * What the cache holds, entry by entry: the unit the collector keeps or evicts whole.
 *
 *   images/<hash>                 guest images guest/image/build.sh made (files hard-linked
 *                                 into their stages)
 *   stages/<stage>-<hash>         build.sh's stages (kernel, initramfs, rootfs-base, final...)
 *   imported/<address>            images installed from packs (unpack, pull)
 *   untrusted/<name>              image directories build.sh moved aside (never used again)
 *   dockerfile/images/<address>   images built from Dockerfiles
 *   dockerfile/layers/<key>       Dockerfile step layers (qcow2, each backed by the one before)
 *   oci/rootfs/sha256/<hex>       flattened pulled images
 *   oci/layers/sha256/<hex>.tar   pulled layers, uncompressed
 *
 * Never an entry (never touched): the locks, resolve/, what is being written (tmp-*, tmp/,
 * names starting with "."), dockerfile/results/ (small; a result whose image is gone is a miss),
 * oci/blobs/ (manifests and configs: small), the collector's own pins/ and users/.
 *
 * Sizes are the blocks a file takes, counted per inode: an image and its final stage share
 * their files (hard links), and deleting one of the two frees nothing.
 */
import { lstat, readdir } from "node:fs/promises";
import { join, relative, sep } from "node:path";

export type EntryKind =
  | "image"
  | "stage"
  | "imported"
  | "untrusted"
  | "dockerfile-image"
  | "dockerfile-layer"
  | "oci-rootfs"
  | "oci-layer";

/** Where each kind lives under the cache directory. */
export const AREAS: ReadonlyArray<{ kind: EntryKind; dir: string; files?: RegExp }> = [
  { kind: "image", dir: "images" },
  { kind: "stage", dir: "stages" },
  { kind: "imported", dir: "imported" },
  { kind: "untrusted", dir: "untrusted" },
  { kind: "dockerfile-image", dir: "dockerfile/images" },
  { kind: "dockerfile-layer", dir: "dockerfile/layers" },
  { kind: "oci-rootfs", dir: "oci/rootfs/sha256" },
  { kind: "oci-layer", dir: "oci/layers/sha256", files: /^[0-9a-f]{64}\.tar$/ },
];

/** One file's blocks, named by its inode (hard links share one). */
export interface FileUse {
  inode: string;
  bytes: number;
  nlink: number;
}

export interface CacheEntry {
  /** Its path relative to the cache directory, e.g. "images/<hash>": its name in reports. */
  id: string;
  kind: EntryKind;
  path: string;
  /** Last use (ms since the epoch): its mtime (build.sh and the pins touch what they use). */
  lastUse: number;
  files: FileUse[];
  /** The qcow2 layer files in it (a Dockerfile step layer's: it names its backing file). */
  layers: string[];
}

/** A name of an area that is an entry (not in progress, not hidden). */
const isEntryName = (name: string): boolean => !name.startsWith(".") && !name.startsWith("tmp-");

/** Bound on the files walked in one entry (a flattened image has tens of thousands). */
const MAX_FILES_PER_ENTRY = 2_000_000;

/** Walks `path`, collecting its files; `layers` (when given) gets its *.qcow2 files. */
async function walk(path: string, out: FileUse[], layers: string[] | null): Promise<void> {
  const st = await lstat(path).catch(() => null);
  if (!st) return;
  if (out.length >= MAX_FILES_PER_ENTRY) return;
  out.push({ inode: `${st.dev}:${st.ino}`, bytes: st.blocks * 512, nlink: st.nlink });
  if (layers && st.isFile() && path.endsWith(".qcow2")) layers.push(path);
  if (!st.isDirectory()) return;
  for (const name of await readdir(path).catch(() => [] as string[]))
    await walk(join(path, name), out, layers);
}

/** Every entry of the cache at `cacheDir`, with its files. */
export async function listEntries(cacheDir: string): Promise<CacheEntry[]> {
  const out: CacheEntry[] = [];
  for (const area of AREAS) {
    const dir = join(cacheDir, area.dir);
    for (const name of (await readdir(dir).catch(() => [] as string[])).sort()) {
      if (!isEntryName(name)) continue;
      if (area.files && !area.files.test(name)) continue;
      const path = join(dir, name);
      const st = await lstat(path).catch(() => null);
      if (!st || st.isSymbolicLink()) continue;
      if (!area.files && !st.isDirectory()) continue;
      const files: FileUse[] = [];
      const layers: string[] = [];
      // Only forkd's own layers name backing files (an image's tree may hold anything).
      await walk(path, files, area.kind === "dockerfile-layer" ? layers : null);
      out.push({ id: `${area.dir}/${name}`, kind: area.kind, path, lastUse: st.mtimeMs, files, layers });
    }
  }
  return out;
}

/**
 * The entry id a path in the cache belongs to ("images/<hash>" for
 * "<cache>/images/<hash>/rootfs.ext4"); null for a path outside every entry.
 */
export function entryIdOf(cacheDir: string, path: string): string | null {
  const rel = relative(cacheDir, path);
  if (rel === "" || rel.startsWith("..") || rel.startsWith(sep)) return null;
  const parts = rel.split(sep);
  for (const area of AREAS) {
    const a = area.dir.split("/");
    if (parts.length <= a.length || a.some((p, i) => parts[i] !== p)) continue;
    const name = parts[a.length] as string;
    if (!isEntryName(name) || (area.files && !area.files.test(name))) return null;
    return `${area.dir}/${name}`;
  }
  return null;
}
