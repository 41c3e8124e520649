/**
 * The snapshot store: one directory per tag under <data>/snapshots, published by an atomic
 * rename once complete. Incomplete builds live in `.staging-*` directories and are removed at
 * startup; a tag directory therefore always holds a complete snapshot.
 *
 *   <tag>/meta.json    versioned, checksummed metadata (meta.ts)
 *   <tag>/memory       guest RAM image, mapped MAP_PRIVATE read-only by every child
 *   <tag>/vmstate      device state (QEMU migration stream without RAM)
 *   <tag>/disk.qcow2   the parent's disk layer, frozen at the snapshot
 *   <tag>/child.qcow2  an empty layer over disk.qcow2, copied for each child
 */
import { readdir, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { ForkdError } from "../util/errors.js";
import { fsyncDir } from "../util/atomic.js";
import { assertTag, isValidTag } from "../util/ids.js";
import { readMeta, sha256File } from "./meta.js";
import type { SnapshotMeta } from "./meta.js";

export interface SnapshotFiles {
  dir: string;
  meta: string;
  memory: string;
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

export interface Snapshot {
  meta: SnapshotMeta;
  files: SnapshotFiles;
}

export class SnapshotStore {
  /** Snapshots verified since this process started: forks do not re-verify (or re-hash) them. */
  private readonly verified = new Map<string, Snapshot>();
  private readonly busy = new Set<string>();

  constructor(readonly root: string) {}

  filesFor(tag: string): SnapshotFiles {
    return snapshotFiles(join(this.root, assertTag(tag)));
  }

  /** Whether a snapshot is published under `tag` (no verification). */
  async has(tag: string): Promise<boolean> {
    return exists(join(this.root, assertTag(tag)));
  }

  /** Removes leftovers of builds interrupted by a crash. */
  async recover(): Promise<string[]> {
    const removed: string[] = [];
    for (const name of await readdir(this.root).catch(() => [] as string[])) {
      if (name.startsWith(".staging-")) {
        await rm(join(this.root, name), { recursive: true, force: true });
        removed.push(name);
      }
    }
    return removed;
  }

  stagingDir(suffix: string): string {
    return join(this.root, `.staging-${suffix}`);
  }

  /** Claims a tag for creation; a second claim while the first is in flight is a conflict. */
  async claim(tag: string): Promise<() => void> {
    assertTag(tag);
    if (this.busy.has(tag))
      throw new ForkdError("conflict", `snapshot ${tag} is being created or deleted`, { tag });
    if (await this.has(tag)) throw new ForkdError("conflict", `snapshot ${tag} already exists`, { tag });
    this.busy.add(tag);
    return () => this.busy.delete(tag);
  }

  /** Publishes a complete staging directory as `tag`. */
  async publish(staging: string, tag: string): Promise<void> {
    const dest = join(this.root, assertTag(tag));
    if (await exists(dest)) throw new ForkdError("conflict", `snapshot ${tag} already exists`, { tag });
    await rename(staging, dest);
    await fsyncDir(this.root);
  }

  async list(): Promise<SnapshotMeta[]> {
    const out: SnapshotMeta[] = [];
    for (const name of (await readdir(this.root).catch(() => [] as string[])).sort()) {
      if (!isValidTag(name)) continue;
      try {
        out.push(await readMeta(snapshotFiles(join(this.root, name)).meta));
      } catch {
        // A corrupt snapshot is reported by get(), not hidden silently: list what is readable.
      }
    }
    return out;
  }

  /** Reads and verifies a snapshot once (metadata checksum, device-state hash, file sizes). */
  async get(tag: string): Promise<Snapshot> {
    assertTag(tag);
    const cached = this.verified.get(tag);
    if (cached) return cached;
    const files = snapshotFiles(join(this.root, tag));
    if (!(await exists(files.dir))) throw new ForkdError("not_found", `no snapshot tagged ${tag}`, { tag });
    const meta = await readMeta(files.meta);
    if (meta.tag !== tag) throw new ForkdError("snapshot_corrupt", `snapshot ${tag} claims tag ${meta.tag}`);
    const vm = await sha256File(files.vmstate).catch(() => null);
    if (!vm || vm.sha256 !== meta.files.vmstate.sha256) {
      throw new ForkdError("snapshot_corrupt", `snapshot ${tag}: device state does not match its checksum`, {
        tag,
      });
    }
    for (const [name, path] of [
      ["memory", files.memory],
      ["disk", files.disk],
    ] as const) {
      const st = await stat(path).catch(() => null);
      if (!st || st.size !== meta.files[name].size) {
        throw new ForkdError(
          "snapshot_corrupt",
          `snapshot ${tag}: ${name} file is missing or has the wrong size`,
          { tag },
        );
      }
    }
    const snap = { meta, files };
    this.verified.set(tag, snap);
    return snap;
  }

  /** Deletes a snapshot: renamed away first (atomic disappearance), then removed. */
  async delete(tag: string): Promise<void> {
    assertTag(tag);
    if (this.busy.has(tag)) throw new ForkdError("conflict", `snapshot ${tag} is busy`, { tag });
    const dir = join(this.root, tag);
    if (!(await exists(dir))) throw new ForkdError("not_found", `no snapshot tagged ${tag}`, { tag });
    this.busy.add(tag);
    try {
      const trash = this.stagingDir(`deleted-${tag}-${Date.now()}`);
      await rename(dir, trash);
      this.verified.delete(tag);
      await fsyncDir(this.root);
      await rm(trash, { recursive: true, force: true });
    } finally {
      this.busy.delete(tag);
    }
  }
}

async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}
