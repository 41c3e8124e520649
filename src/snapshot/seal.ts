/**
 * Sealing a snapshot: the one place a staging directory becomes a published snapshot, and so
 * the one place the format's invariants are written (docs/snapshot-format.md): the files and
 * their names, their modes (the images 0444, the per-child empty layer 0644 over the published
 * frozen layer), the checksums the metadata records, metadata written with write + fsync +
 * rename, and publication by one rename of the whole directory. Every path that makes a
 * snapshot (create, branch, compact, unpack and pull) ends here through SnapshotStore.seal.
 *
 * Crash safety: until the rename the tag does not exist; a daemon killed at any step leaves a
 * `.staging-*` directory that SnapshotStore.recover removes (recording a background write as
 * failed), never a half snapshot under the tag.
 */
import { chmod, rm } from "node:fs/promises";
import { join } from "node:path";
import { createOverlay } from "../disk/index.js";
import { ForkdError } from "../util/index.js";
import { SNAPSHOT_FORMAT, sha256File, writeMeta } from "./meta.js";
import type { SnapshotMeta } from "./meta.js";

export interface SnapshotFiles {
  dir: string;
  meta: string;
  /** The image a child maps: of a diff snapshot (after get()), its memory base's. */
  memory: string;
  /** A diff snapshot's own memory: pages written into a child before it runs (restore.ts). */
  memoryDiff?: string;
  vmstate: string;
  disk: string;
  childDisk: string;
}

export const snapshotFiles = (dir: string): SnapshotFiles => ({
  dir,
  meta: join(dir, "meta.json"),
  memory: join(dir, "memory"),
  vmstate: join(dir, "vmstate"),
  disk: join(dir, "disk.qcow2"),
  childDisk: join(dir, "child.qcow2"),
});

/** Where a diff snapshot in `dir` keeps its diff. */
export const memoryDiffFile = (dir: string): string => join(dir, "memory.diff");

/** The mode of a snapshot's images (memory or memory.diff, vmstate, disk.qcow2): never written again. */
export const IMAGE_MODE = 0o444;

type FileSum = SnapshotMeta["files"]["memory"];

/**
 * The metadata a sealer gives: everything but the tag, the checksum and the format (the seal
 * sets them), with the sums it already knows. A sum left out is computed from the staging
 * directory's file; one given is the caller's word (a file shared with, or verified against, a
 * snapshot whose sums are known). A diff snapshot (memoryBase set) gives `files.memory`: its
 * base's image, which is not in its directory.
 */
export type SealMeta = Omit<SnapshotMeta, "checksum" | "tag" | "files" | "format"> & {
  format?: number;
  files: { memory?: FileSum; memoryDiff?: FileSum; vmstate?: FileSum; disk?: FileSum };
};

/** What sealing needs of the store. */
export interface SealTarget {
  filesFor(tag: string): SnapshotFiles;
  publish(staging: string, tag: string): Promise<void>;
}

export interface SealOptions {
  /** Called just before the rename (crash points; a cancelled creation throws here). */
  beforePublish?: () => void;
}

/**
 * Seals `staging` (holding memory or memory.diff, vmstate and disk.qcow2, the latter's backing
 * already this host's) as snapshot `tag` and publishes it. Returns the metadata written.
 */
export async function sealSnapshot(
  target: SealTarget,
  staging: string,
  tag: string,
  meta: SealMeta,
  opts: SealOptions = {},
): Promise<SnapshotMeta> {
  const files = snapshotFiles(staging);
  const diff = meta.memoryBase !== undefined && meta.memoryBase !== null;
  const ownMemory = diff ? memoryDiffFile(staging) : files.memory;
  if (diff && !meta.files.memory)
    throw new ForkdError("internal", `sealing ${tag}: a diff snapshot needs its base image's sum`);
  const sumOf = (known: FileSum | undefined, path: string): Promise<FileSum> =>
    known ? Promise.resolve(known) : sha256File(path);
  const [memory, vmstate, disk] = await Promise.all([
    sumOf(diff ? meta.files.memoryDiff : meta.files.memory, ownMemory),
    sumOf(meta.files.vmstate, files.vmstate),
    sumOf(meta.files.disk, files.disk),
  ]);
  await Promise.all([ownMemory, files.vmstate, files.disk].map((f) => chmod(f, IMAGE_MODE)));
  // Children copy this empty layer; it names the published path of the frozen layer.
  await createOverlay(files.childDisk, {
    backing: target.filesFor(tag).disk,
    backingFormat: "qcow2",
    sizeBytes: meta.diskSize,
  });
  const { files: _given, ...rest } = meta;
  const written = await writeMeta(files.meta, {
    ...rest,
    format: SNAPSHOT_FORMAT, // writeMeta records the current format (3 for a diff snapshot)
    tag,
    files: diff
      ? { memory: meta.files.memory as FileSum, vmstate, disk, memoryDiff: memory }
      : { memory, vmstate, disk },
  });
  opts.beforePublish?.();
  await target.publish(staging, tag);
  // A background write's marker (SnapshotStore.markWriting) is kept until published: a crash
  // before the rename leaves a staging directory recovery records as failed.
  await rm(join(target.filesFor(tag).dir, "status.json"), { force: true });
  return written;
}
