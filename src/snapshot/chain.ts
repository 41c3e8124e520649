/**
 * Chains of branches: compact (flatten a chain into a new base tag), flatten in place (so a
 * dependent survives its parent's forced deletion), and the subtree under a tag.
 *
 * A branch's memory image is already flat (branch.ts writes parent image + private pages), so
 * only its disk is a chain: its layer backs onto its parent's, down to the guest image's root
 * filesystem. Flattening converts the chain into one layer over that root filesystem.
 */
import { chmod, copyFile, link, mkdir, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { createOverlay } from "../disk/overlay.js";
import { ForkdError } from "../util/errors.js";
import { run } from "../util/proc.js";
import { sha256File, writeMeta } from "./meta.js";
import type { SnapshotMeta } from "./meta.js";
import type { Snapshot, SnapshotStore } from "./store.js";

const rootfsOf = (meta: SnapshotMeta): string => join(meta.image.dir, "rootfs.ext4");

/** Writes `out`: the whole disk chain under `top` as one qcow2 layer over the image's rootfs. */
async function flattenDisk(top: string, meta: SnapshotMeta, out: string): Promise<void> {
  await run(
    "qemu-img",
    [
      "convert",
      "-U",
      "-q",
      "-O",
      "qcow2",
      "-o",
      "lazy_refcounts=on",
      "-B",
      rootfsOf(meta),
      "-F",
      "raw",
      top,
      out,
    ],
    { timeoutMs: 3_600_000 },
  );
}

async function linkOrCopy(from: string, to: string): Promise<void> {
  await link(from, to).catch(async (e: NodeJS.ErrnoException) => {
    if (e.code !== "EXDEV") throw e;
    await copyFile(from, to);
  });
}

/** A new base snapshot `newTag` with `tag`'s state and no parent. */
export async function compactSnapshot(
  store: SnapshotStore,
  tag: string,
  newTag: string,
): Promise<SnapshotMeta> {
  const src = await store.get(tag);
  const release = await store.claim(newTag);
  const staging = store.stagingDir(`${newTag}-compact-${Date.now().toString(36)}`);
  try {
    await mkdir(staging, { mode: 0o700 });
    const files = {
      memory: join(staging, "memory"),
      vmstate: join(staging, "vmstate"),
      disk: join(staging, "disk.qcow2"),
      childDisk: join(staging, "child.qcow2"),
    };
    // Memory and device state are immutable files: share them.
    await linkOrCopy(src.files.memory, files.memory);
    await linkOrCopy(src.files.vmstate, files.vmstate);
    await flattenDisk(src.files.disk, src.meta, files.disk);
    await chmod(files.disk, 0o444);
    await createOverlay(files.childDisk, {
      backing: store.filesFor(newTag).disk,
      backingFormat: "qcow2",
      sizeBytes: src.meta.diskSize,
      unsafe: true,
    });
    const { checksum: _drop, branch: _branch, parent: _parent, ...rest } = src.meta;
    const meta = await writeMeta(join(staging, "meta.json"), {
      ...rest,
      tag: newTag,
      created: new Date().toISOString(),
      parent: null,
      files: { ...src.meta.files, disk: await sha256File(files.disk) },
    });
    await store.publish(staging, newTag);
    return meta;
  } finally {
    await rm(staging, { recursive: true, force: true });
    release();
  }
}

/**
 * Makes `tag` independent of its parent, in place: its disk layer is replaced (by rename, so
 * VMs that have the old file open keep it) with the flattened chain, and its metadata loses
 * its parent. Used before a forced delete of the parent.
 */
export async function flattenInPlace(store: SnapshotStore, snap: Snapshot): Promise<void> {
  if (!snap.meta.parent) return;
  const tmp = join(snap.files.dir, `.disk-flat-${Date.now().toString(36)}.qcow2`);
  try {
    await flattenDisk(snap.files.disk, snap.meta, tmp);
    await chmod(tmp, 0o444);
    const disk = await sha256File(tmp);
    const { checksum: _drop, ...rest } = snap.meta;
    const next = { ...rest, parent: null, files: { ...snap.meta.files, disk } };
    // Disk first, then metadata: a crash between leaves a flat disk with a parent recorded,
    // which still forks (the recorded parent is only checked while it exists).
    await rename(tmp, snap.files.disk);
    await writeMeta(snap.files.meta, next);
    store.forget(snap.meta.tag);
  } finally {
    await rm(tmp, { force: true });
  }
}

/** Every snapshot stacked on `tag`, directly or not, deepest first. */
export async function descendants(store: SnapshotStore, tag: string): Promise<string[]> {
  const all = await store.list();
  const out: string[] = [];
  const visit = (t: string, depth: number) => {
    if (depth > 1000) throw new ForkdError("snapshot_corrupt", `snapshot chain under ${tag} is too deep`);
    for (const m of all) {
      if (m.parent?.tag === t) {
        visit(m.tag, depth + 1);
        out.push(m.tag);
      }
    }
  };
  visit(tag, 0);
  return out;
}
