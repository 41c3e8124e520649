/**
 * Chains of branches: compact (flatten a chain into a new base tag), flatten in place (so a
 * dependent survives its parent's forced deletion), and the subtree under a tag.
 *
 * A branch's disk is a chain: its layer backs onto its parent's, down to the guest image's root
 * filesystem. Flattening converts the chain into one layer over that root filesystem. Its memory
 * is at most one step away from a full image: a diff snapshot's diff is relative to the full
 * image of its `memoryBase` (an ancestor; cumulative, branch.ts), and a snapshot that would
 * lose that ancestor (compact, a forced delete) gets a full image = base + diff first.
 */
import { chmod, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { flattenLayers } from "../disk/index.js";
import type { ToolRunner } from "../vmm/index.js";
import { linkOrCopy } from "../util/index.js";
import { ForkdError } from "../util/index.js";
import { readMeta, sha256File, writeMeta } from "./meta.js";
import type { SnapshotMeta } from "./meta.js";
import { applyMemoryDiff } from "./memory-diff.js";
import { snapshotFiles } from "./store.js";
import type { Snapshot, SnapshotStore } from "./store.js";

const rootfsOf = (meta: SnapshotMeta): string => join(meta.image.dir, "rootfs.ext4");

/**
 * Writes `out`: the whole disk chain under `snap`'s disk as one qcow2 layer over the image's
 * rootfs (VMMs wrote the layers: qemu-img runs jailed, seeing the chain's files alone).
 */
const flattenToRootfs = async (
  tools: ToolRunner,
  store: SnapshotStore,
  snap: Snapshot,
  out: string,
): Promise<void> =>
  flattenLayers(tools, snap.files.disk, { path: rootfsOf(snap.meta), format: "raw" }, out, [
    ...(await store.chainDirs(snap)),
    snap.meta.image.dir,
  ]);

/** A new base snapshot `newTag` with `tag`'s state and no parent. */
export async function compactSnapshot(
  store: SnapshotStore,
  tag: string,
  newTag: string,
  tools: ToolRunner,
): Promise<SnapshotMeta> {
  const src = await store.get(tag);
  const release = await store.claim(newTag);
  const suffix = `${newTag}-compact-${Date.now().toString(36)}`;
  const staging = store.stagingDir(suffix);
  try {
    await store.stage(suffix);
    const files = snapshotFiles(staging);
    // Memory and device state are immutable files: share them; a diff snapshot's memory is made
    // a full image (a base stands alone).
    if (src.files.memoryDiff) await applyMemoryDiff(src.files.memory, src.files.memoryDiff, files.memory);
    else await linkOrCopy(src.files.memory, files.memory);
    await linkOrCopy(src.files.vmstate, files.vmstate);
    await flattenToRootfs(tools, store, src, files.disk);
    const {
      checksum: _drop,
      branch: _branch,
      parent: _parent,
      memoryBase: _mb,
      tag: _t,
      files: sums,
      ...rest
    } = src.meta;
    // Shared files keep their recorded sums; a materialized image and the new layer are hashed.
    return await store.seal(staging, newTag, {
      ...rest,
      created: new Date().toISOString(),
      parent: null,
      files: { vmstate: sums.vmstate, ...(src.files.memoryDiff ? {} : { memory: sums.memory }) },
    });
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
export async function flattenInPlace(store: SnapshotStore, snap: Snapshot, tools: ToolRunner): Promise<void> {
  if (!snap.meta.parent) return;
  const tmp = join(snap.files.dir, `.disk-flat-${Date.now().toString(36)}.qcow2`);
  try {
    await flattenToRootfs(tools, store, snap, tmp);
    await chmod(tmp, 0o444);
    const disk = await sha256File(tmp);
    const { checksum: _drop, ...rest } = snap.meta;
    const next = { ...rest, parent: null, files: { ...snap.meta.files, disk } };
    // Disk first, then metadata: a crash between leaves a flat disk with a parent recorded,
    // which still forks (the recorded parent is only checked while it exists).
    await rename(tmp, snap.files.disk);
    await rewriteMeta(store, snap.meta.tag, next);
  } finally {
    await rm(tmp, { force: true });
  }
}

/**
 * Rewrites `tag`'s metadata in place as `next`, and the parent checksum its dependents record
 * (theirs change with it, so down the whole subtree): a branch checks its parent is the one it
 * was taken from, and a rewrite that keeps the parent's content (flattened, materialized) must
 * not make its branches unusable once the daemon restarts.
 */
async function rewriteMeta(
  store: SnapshotStore,
  tag: string,
  next: Omit<SnapshotMeta, "checksum">,
): Promise<void> {
  const meta = await writeMeta(store.filesFor(tag).meta, next);
  store.forget(tag);
  for (const dep of await store.dependents(tag)) {
    const d = await readMeta(store.filesFor(dep).meta);
    if (d.parent?.tag !== tag || d.parent.checksum === meta.checksum) continue;
    const { checksum: _c, ...rest } = d;
    await rewriteMeta(store, dep, { ...rest, parent: { tag, checksum: meta.checksum } });
  }
}

/**
 * Gives diff snapshot `snap` a full memory image in place (its base's image + its diff), so it
 * no longer needs its memory base: the image is renamed in first, then the metadata rewritten
 * without `memoryBase` (a crash between leaves a diff snapshot with a spare image, which forks
 * as the diff it still is), then the diff removed.
 */
export async function materializeMemory(store: SnapshotStore, snap: Snapshot): Promise<void> {
  if (!snap.files.memoryDiff || !snap.meta.memoryBase) return;
  const own = join(snap.files.dir, "memory");
  const tmp = join(snap.files.dir, `.memory-full-${Date.now().toString(36)}`);
  try {
    await applyMemoryDiff(snap.files.memory, snap.files.memoryDiff, tmp);
    const memory = await sha256File(tmp);
    await rename(tmp, own);
    const { checksum: _drop, memoryBase: _mb, ...rest } = snap.meta;
    const { memoryDiff: _md, ...sums } = snap.meta.files;
    await rewriteMeta(store, snap.meta.tag, { ...rest, files: { ...sums, memory } });
    await rm(snap.files.memoryDiff, { force: true });
  } finally {
    await rm(tmp, { force: true });
  }
}

/**
 * Snapshots under `tag` whose memory base is `tag` or above it: once `tag` goes, their base is
 * no longer among their ancestors (a pack of them would lack it), so they need full images.
 */
async function losingMemoryBase(store: SnapshotStore, tag: string): Promise<string[]> {
  const below = new Set(await descendants(store, tag));
  return (await store.list())
    .filter((m) => below.has(m.tag) && m.memoryBase !== undefined && !below.has(m.memoryBase.tag))
    .map((m) => m.tag);
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
  /**
   * Called just before `tag` goes, or its memory is rewritten as a full image (to drain its warm
   * pool: pre-started VMMs map the image they were started with).
   */
  beforeDelete(tag: string): Promise<void>;
  /** Runs qemu-img flattening a dependent (force), jailed. */
  tools: ToolRunner;
  /**
   * Called once the local checks passed, before anything changes, with every tag that would be
   * deleted (a cluster's checks and catalog: ./cluster.ts); a throw refuses the delete.
   */
  beforeChange?: (tags: string[]) => Promise<void>;
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
  // A child of a diff snapshot maps its memory base's image: a snapshot whose memory is
  // rewritten (force) must not have children either.
  const rewritten = o.force ? await losingMemoryBase(store, tag) : [];
  for (const t of [tag, ...below, ...rewritten]) {
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
  if (hooks.beforeChange) {
    // Refused for its dependents here, before the cluster is told (store.delete would refuse later).
    if (!o.cascade && !o.force && (await store.has(tag))) await store.assertNoDependents(tag);
    await hooks.beforeChange([...below, tag]);
  }
  const orphaned: string[] = [];
  if (o.force) {
    for (const t of rewritten) {
      await hooks.beforeDelete(t);
      await materializeMemory(store, await store.get(t));
    }
    for (const dep of await store.dependents(tag)) {
      await flattenInPlace(store, await store.get(dep), hooks.tools);
      orphaned.push(dep);
    }
  }
  for (const t of [...below, tag]) {
    await hooks.beforeDelete(t);
    await store.delete(t);
  }
  return { ...(o.cascade ? { cascaded: below } : {}), ...(o.force ? { orphaned } : {}) };
}

/** What deleteSnapshot() with the same options would do, found without changing anything. */
export interface DeletePlan {
  /** Tags that would be deleted, in the order they would go. */
  deletes: string[];
  /** Dependents that would be flattened to no longer need it (force). */
  orphans: string[];
  /** Branches stacked on it that refuse the delete (neither cascade nor force). */
  blockingDependents: string[];
  /** Tags (of those it would delete or rewrite) that sandboxes use: each refuses the delete. */
  inUse: string[];
}

export async function planDelete(
  store: SnapshotStore,
  tag: string,
  o: { cascade: boolean; force: boolean },
  inUse: (tag: string) => number,
): Promise<DeletePlan> {
  if (o.cascade && o.force) throw new ForkdError("invalid_argument", "cascade and force exclude each other");
  if (!(await store.has(tag)) && (await store.pending(tag))?.status !== "failed")
    throw new ForkdError("not_found", `no snapshot tagged ${tag}`, { tag });
  const below = o.cascade ? await descendants(store, tag) : [];
  const rewritten = o.force ? await losingMemoryBase(store, tag) : [];
  const deps = [...new Set([...(await store.dependents(tag)), ...(await store.memoryDependents(tag))])];
  return {
    deletes: [...below, tag],
    orphans: o.force ? await store.dependents(tag) : [],
    blockingDependents: o.cascade || o.force ? [] : deps,
    inUse: [tag, ...below, ...rewritten].filter((t) => inUse(t) > 0),
  };
}
