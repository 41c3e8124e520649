/**
 * Chains of branches: compact (flatten a chain into a new base tag), flatten in place (so a
 * dependent survives its parent's forced deletion), and the subtree under a tag.
 *
 * A branch's memory image is already flat (branch.ts writes parent image + private pages), so
 * only its disk is a chain: its layer backs onto its parent's, down to the guest image's root
 * filesystem. Flattening converts the chain into one layer over that root filesystem.
 */
import { chmod, mkdir, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { createOverlay, flattenLayers } from "../disk/overlay.js";
import { linkOrCopy } from "../util/fs.js";
import { ForkdError } from "../util/errors.js";
import { sha256File, writeMeta } from "./meta.js";
import type { SnapshotMeta } from "./meta.js";
import type { Snapshot, SnapshotStore } from "./store.js";

const rootfsOf = (meta: SnapshotMeta): string => join(meta.image.dir, "rootfs.ext4");

/** Writes `out`: the whole disk chain under `top` as one qcow2 layer over the image's rootfs. */
const flattenToRootfs = (top: string, meta: SnapshotMeta, out: string): Promise<void> =>
  flattenLayers(top, { path: rootfsOf(meta), format: "raw" }, out);

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
    await flattenToRootfs(src.files.disk, src.meta, files.disk);
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
    await flattenToRootfs(snap.files.disk, snap.meta, tmp);
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

export interface DeleteHooks {
  /** Sandboxes running, paused or starting from `tag`: a snapshot in use is never deleted. */
  inUse(tag: string): number;
  /** Called just before `tag` goes (e.g. to drain its warm pool). */
  beforeDelete(tag: string): Promise<void>;
}

/**
 * Deletes `tag`. With dependents it refuses (409, store.delete) unless `cascade` (the whole
 * subtree goes, deepest first; refused if any of it is in use) or `force` (each direct dependent
 * is flattened in place first, so it no longer needs `tag`).
 */
export async function deleteSnapshot(
  store: SnapshotStore,
  tag: string,
  o: { cascade: boolean; force: boolean },
  hooks: DeleteHooks,
): Promise<{ cascaded?: string[]; orphaned?: string[] }> {
  if (o.cascade && o.force) throw new ForkdError("invalid_argument", "cascade and force exclude each other");
  const below = o.cascade ? await descendants(store, tag) : [];
  for (const t of [tag, ...below]) {
    const users = hooks.inUse(t);
    if (users > 0) {
      throw new ForkdError(
        "conflict",
        `snapshot ${t} has ${users} running, paused or starting sandboxes; kill them first`,
        {
          tag: t,
          sandboxes: users,
        },
      );
    }
  }
  const orphaned: string[] = [];
  if (o.force) {
    for (const dep of await store.dependents(tag)) {
      await flattenInPlace(store, await store.get(dep));
      orphaned.push(dep);
    }
  }
  for (const t of [...below, tag]) {
    await hooks.beforeDelete(t);
    await store.delete(t);
  }
  return { ...(o.cascade ? { cascaded: below } : {}), ...(o.force ? { orphaned } : {}) };
}
