/**
 * The snapshot store: one directory per key (a tag in its namespace: namespace.ts) under
 * <data>/snapshots, `<tag>` or `<tenant>~<tag>`, published by an atomic rename once complete. Incomplete builds live in `.staging-*` directories and are removed at
 * startup; a tag directory therefore always holds a complete snapshot.
 *
 *   <tag>/meta.json    versioned, checksummed metadata (meta.ts)
 *   <tag>/memory       guest RAM image, mapped MAP_PRIVATE read-only by every child
 *   <tag>/memory.diff  instead of memory, in a diff snapshot (a BRANCH): its private pages over
 *                      its memory base's image (meta.memoryBase), which its children map
 *   <tag>/vmstate      device state (QEMU migration stream without RAM)
 *   <tag>/disk.qcow2   the parent's disk layer, frozen at the snapshot
 *   <tag>/child.qcow2  an empty layer over disk.qcow2, copied for each child
 *
 * A snapshot written in the background (an async BRANCH) is `writing` until published: its
 * staging directory holds `status.json` naming the tag. If the daemon dies first, recovery
 * turns it into `.failed-<tag>.json` (reason and time) and removes the partial files, so the
 * tag reads `failed` until deleted or re-created, and never `ready` while half-written.
 */
import { mkdir, readdir, readFile, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { z } from "zod";
import { ForkdError } from "../util/index.js";
import { fsyncDir, writeJsonAtomic } from "../util/index.js";
import { exists } from "../util/index.js";
import { assertKey, isValidKey } from "../util/index.js";
import { readMeta, sha256File } from "./meta.js";
import { keyDir, keyOfDir } from "./namespace.js";
import type { KeyEntry } from "./namespace.js";
import type { Quarantine } from "../util/index.js";
import type { SnapshotMeta } from "./meta.js";
import { memoryDiffFile, sealSnapshot, snapshotFiles } from "./seal.js";
import type { SealMeta, SealOptions, SnapshotFiles } from "./seal.js";
import type { SnapshotCluster } from "./cluster.js";

export { memoryDiffFile, snapshotFiles } from "./seal.js";
export type { SnapshotFiles } from "./seal.js";

export interface Snapshot {
  meta: SnapshotMeta;
  files: SnapshotFiles;
}

/** A snapshot that is not ready: being written, or failed (and cleaned). */
export interface SnapshotPending {
  tag: string;
  status: "writing" | "failed";
  started: string;
  source: string | null;
  error: { code: string; message: string } | null;
  /** The tenant it is written for (null or absent: an admin). */
  owner?: string | null;
}

export interface SnapshotInfo {
  tag: string;
  depth: number;
  ancestors: string[];
  dependents: string[];
  logical_bytes: number;
  physical_bytes: number;
}

/** What the store tells (src/events/bus.ts carries it to listeners: its CoreEvent). */
export type SnapshotEvent =
  /**
   * A snapshot tag was created or changed status (writing, ready, failed). `writing`: the status
   * at the change, for one that may end before a consumer reads it (a creation that fails at once).
   */
  | { type: "snapshot"; tag: string; writing?: SnapshotPending }
  /** A snapshot tag (ready or failed) was deleted. */
  | { type: "snapshot-gone"; tag: string };

/** Where the store tells it: the daemon's event bus, or nowhere. */
export interface SnapshotEventSink {
  emit(e: SnapshotEvent): void;
}

/** What a staging directory of a background write says about itself (status.json). */
const StagingStatusSchema = z.object({
  tag: z.string().max(129),
  started: z.string().max(64),
  source: z.string().max(64).nullable(),
  owner: z.string().max(256).nullable().optional(),
});
type StagingStatus = z.infer<typeof StagingStatusSchema>;

/** A failed write's record (.failed-<tag>.json). */
const PendingSchema = StagingStatusSchema.extend({
  status: z.literal("failed"),
  error: z.object({ code: z.string().max(64), message: z.string().max(65536) }).nullable(),
});

const FAILED_PREFIX = ".failed-";
/** The owner lookup() gives a snapshot whose metadata does not read: no tenant's (TENANT_RE). */
const UNREADABLE_OWNER = "@unreadable";

export class SnapshotStore {
  /** Snapshots verified since this process started: forks do not re-verify (or re-hash) them. */
  private readonly verified = new Map<string, Snapshot>();
  private readonly busy = new Set<string>();
  /** Snapshots being written in the background, by tag. */
  private readonly writing = new Map<string, { info: SnapshotPending; done: Promise<Snapshot> }>();
  /**
   * Creations its client waits on (POST /v1/snapshots, a Dockerfile build), by tag: listed as
   * `writing` so the tree shows them, but nothing waits on them (a fork of the tag is refused as
   * before: it does not exist yet).
   */
  private readonly creating = new Map<string, SnapshotPending>();

  /**
   * `events`: where tags' creation, status changes and deletion are told (src/events/bus.ts).
   * `cluster`: the cluster's catalog a new tag is claimed and published in (./cluster.ts; null:
   * a daemon alone).
   */
  constructor(
    readonly root: string,
    private readonly events: SnapshotEventSink = { emit: () => undefined },
    readonly cluster: SnapshotCluster | null = null,
  ) {}

  /** The directory of key `tag` (this store's paths are all made here and in stagingDir). */
  private dirOf(tag: string): string {
    return join(this.root, keyDir(tag));
  }

  filesFor(tag: string): SnapshotFiles {
    return snapshotFiles(this.dirOf(tag));
  }

  /** Whether a snapshot is published under `tag` (no verification). */
  async has(tag: string): Promise<boolean> {
    return exists(this.dirOf(tag));
  }

  /**
   * What is at key `tag`: its owner and status (namespace.ts), or undefined. A published
   * snapshot whose metadata does not read is owned by no tenant.
   */
  async lookup(tag: string): Promise<KeyEntry | undefined> {
    if (await this.has(tag)) {
      const meta = await readMeta(this.filesFor(tag).meta).catch(() => null);
      return { owner: meta ? (meta.owner ?? null) : UNREADABLE_OWNER, status: "ready" };
    }
    const p = await this.pending(tag);
    return p ? { owner: p.owner ?? null, status: p.status } : undefined;
  }

  /**
   * Removes leftovers of builds interrupted by a crash; a background write that was interrupted
   * is recorded as failed under its tag. Every published snapshot's metadata, and every failure
   * record, is parsed with its schema: one that does not parse (or fails its checksum) is moved
   * to `quarantine` with a log line, never left to fail later or stop the daemon. (Processes
   * still writing into staging directories are killed by the daemon before this runs.)
   */
  async recover(quarantine?: Quarantine): Promise<string[]> {
    const removed: string[] = [];
    for (const name of await readdir(this.root).catch(() => [] as string[])) {
      if (quarantine && keyOfDir(name) !== null) {
        await readMeta(snapshotFiles(join(this.root, name)).meta).catch((e: unknown) =>
          quarantine.keep(join(this.root, name), "snapshot", e instanceof Error ? e.message : String(e)),
        );
        continue;
      }
      if (quarantine && name.startsWith(FAILED_PREFIX) && name.endsWith(".json")) {
        const path = join(this.root, name);
        const ok = await readFile(path, "utf8")
          .then(
            (raw) => PendingSchema.safeParse(JSON.parse(raw)).success,
            () => false,
          )
          .catch(() => false);
        if (!ok) await quarantine.keep(path, "failed-record", "not a valid failure record");
        continue;
      }
      if (!name.startsWith(".staging-")) continue;
      const dir = join(this.root, name);
      const st = await readStagingStatus(dir);
      if (st && isValidKey(st.tag) && !(await this.has(st.tag))) {
        await this.markFailed(
          {
            tag: st.tag,
            status: "failed",
            started: st.started,
            source: st.source,
            error: null,
            owner: st.owner ?? null,
          },
          { code: "internal", message: "the daemon stopped while the snapshot was being written" },
        );
      }
      await rm(dir, { recursive: true, force: true });
      removed.push(name);
    }
    await fsyncDir(this.root);
    return removed;
  }

  /** Marks a staging directory as a background write of `tag` (see recover()). */
  async markWriting(staging: string, st: StagingStatus): Promise<void> {
    await writeJsonAtomic(join(staging, "status.json"), st, 0o600);
  }

  /**
   * Registers a background write of `tag` whose result is `done`: the tag reads `writing` until
   * it settles, then `ready` (published by the writer) or `failed`.
   */
  track(info: Omit<SnapshotPending, "status" | "error">, done: Promise<Snapshot>): void {
    const entry = { info: { ...info, status: "writing" as const, error: null }, done };
    this.writing.set(info.tag, entry);
    // With its status: a consumer learns the source (a branch's sandbox) without a read.
    this.events.emit({ type: "snapshot", tag: info.tag, writing: entry.info });
    done.then(
      () => {
        this.writing.delete(info.tag);
        this.events.emit({ type: "snapshot", tag: info.tag });
      },
      async (e: unknown) => {
        await this.markFailed(entry.info, {
          code: e instanceof ForkdError ? e.code : "internal",
          message: e instanceof Error ? e.message : String(e),
        }).catch(() => undefined);
        this.writing.delete(info.tag);
        this.events.emit({ type: "snapshot", tag: info.tag });
      },
    );
  }

  /**
   * Lists a creation of `info.tag` as `writing` until the returned function is called (with
   * whether it made the snapshot). Nothing is listed for a tag that is published, written in the
   * background, or already announced: that creation fails with a conflict, and must not hide the
   * other. A creation that ends without a snapshot and without a failure record is told gone.
   */
  async announce(info: Omit<SnapshotPending, "status" | "error">): Promise<(made: boolean) => void> {
    const tag = assertKey(info.tag);
    const published = await this.has(tag);
    // From here on, no await: the check and the set are one step.
    if (published || this.writing.has(tag) || this.creating.has(tag) || this.busy.has(tag))
      return () => undefined;
    const entry: SnapshotPending = { ...info, status: "writing", error: null };
    this.creating.set(tag, entry);
    this.events.emit({ type: "snapshot", tag, writing: entry });
    return (made) => {
      if (this.creating.get(tag) !== entry) return;
      this.creating.delete(tag);
      // Made: publish() told it ready. Not made: it reads failed (recordFailed told so) or is gone.
      if (!made) this.events.emit({ type: "snapshot", tag });
    };
  }

  /**
   * Records that a creation of `tag` failed with `e` (its client no longer watched): the tag
   * reads `failed`, with the reason, until deleted or re-created.
   */
  async recordFailed(info: Omit<SnapshotPending, "status" | "error">, e: unknown): Promise<void> {
    await this.markFailed(
      { ...info, status: "failed", error: null },
      {
        code: e instanceof ForkdError ? e.code : "internal",
        message: e instanceof Error ? e.message : String(e),
      },
    );
    this.events.emit({ type: "snapshot", tag: info.tag });
  }

  private failedPath(tag: string): string {
    return join(this.root, FAILED_PREFIX + keyDir(tag) + ".json");
  }

  private async markFailed(p: SnapshotPending, error: { code: string; message: string }): Promise<void> {
    await writeJsonAtomic(this.failedPath(p.tag), { ...p, status: "failed", error }, 0o600);
  }

  /** A tag that is not ready: writing now, or failed; null when it is ready or unknown. */
  async pending(tag: string): Promise<SnapshotPending | null> {
    const w = this.writing.get(assertKey(tag));
    if (w) return w.info;
    // Made again after a failure: it reads writing until this creation ends.
    const c = this.creating.get(tag);
    if (c) return c;
    try {
      const p = PendingSchema.parse(JSON.parse(await readFile(this.failedPath(tag), "utf8")));
      return p.tag === tag ? p : null;
    } catch {
      return null;
    }
  }

  async listPending(): Promise<SnapshotPending[]> {
    const out = [...this.writing.values()].map((w) => w.info);
    // A creation published a moment ago is listed ready, not writing too.
    for (const c of [...this.creating.values()])
      if (!this.writing.has(c.tag) && !(await this.has(c.tag))) out.push(c);
    const listed = new Set(out.map((p) => p.tag));
    for (const name of await readdir(this.root).catch(() => [] as string[])) {
      if (!name.startsWith(FAILED_PREFIX) || !name.endsWith(".json")) continue;
      const tag = keyOfDir(name.slice(FAILED_PREFIX.length, -".json".length));
      if (tag === null || listed.has(tag) || this.writing.has(tag) || this.creating.has(tag)) continue;
      const p = await this.pending(tag);
      if (p) out.push(p);
    }
    return out.sort((a, b) => a.tag.localeCompare(b.tag));
  }

  /**
   * A snapshot to fork from: waits (at most `waitMs`) for one being written; a failed one, or
   * one still writing after the wait, is a clear error, never a partial image.
   */
  async getReady(tag: string, waitMs: number): Promise<Snapshot> {
    const w = this.writing.get(assertKey(tag));
    if (w) {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () =>
            reject(
              new ForkdError("unavailable", `snapshot ${tag} is still being written; try again shortly`, {
                tag,
                status: "writing",
              }),
            ),
          waitMs,
        );
      });
      try {
        await Promise.race([w.done, timeout]);
      } catch (e) {
        if (e instanceof ForkdError && e.code === "unavailable") throw e;
        throw new ForkdError("conflict", `snapshot ${tag} failed while being written: ${String(e)}`, {
          tag,
          status: "failed",
        });
      } finally {
        clearTimeout(timer);
      }
    }
    if (!(await this.has(tag))) {
      const p = await this.pending(tag);
      if (p?.status === "failed") {
        throw new ForkdError("conflict", `snapshot ${tag} failed: ${p.error?.message ?? "unknown"}`, {
          tag,
          status: "failed",
        });
      }
    }
    return this.get(tag);
  }

  /** A staging directory; a key in `suffix` is written as its directory name. */
  stagingDir(suffix: string): string {
    return join(this.root, `.staging-${suffix.replaceAll("/", "~")}`);
  }

  /** A new, empty staging directory (0700) to build a snapshot in, then seal(). */
  async stage(suffix: string): Promise<string> {
    const dir = this.stagingDir(suffix);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    return dir;
  }

  /**
   * Seals `staging` as snapshot `tag` and publishes it (seal.ts: modes, checksums, the child
   * layer, metadata, one rename). The only way a snapshot comes to exist.
   */
  async seal(staging: string, tag: string, meta: SealMeta, opts?: SealOptions): Promise<SnapshotMeta> {
    return sealSnapshot(this, staging, tag, meta, opts);
  }

  /** Claims a tag for creation; a second claim while the first is in flight is a conflict. */
  async claim(tag: string): Promise<() => void> {
    assertKey(tag);
    if (this.busy.has(tag))
      throw new ForkdError("conflict", `snapshot ${tag} is being created or deleted`, { tag });
    if (await this.has(tag)) throw new ForkdError("conflict", `snapshot ${tag} already exists`, { tag });
    this.busy.add(tag);
    // Tags are cluster-wide: one the catalog has is taken (checked before any work).
    if (this.cluster) {
      try {
        await this.cluster.claim(tag);
      } catch (e) {
        this.busy.delete(tag);
        throw e;
      }
    }
    // Re-creating a tag that failed replaces the failure record.
    await rm(this.failedPath(tag), { force: true });
    return () => this.busy.delete(tag);
  }

  /** Publishes a complete staging directory as `tag` (seal.ts calls it, nothing else). */
  async publish(staging: string, tag: string): Promise<void> {
    const dest = this.dirOf(tag);
    if (await exists(dest)) throw new ForkdError("conflict", `snapshot ${tag} already exists`, { tag });
    // In a cluster its catalog entry is written first: a conflict there publishes nothing here.
    if (this.cluster) await this.cluster.publishing(tag, await readMeta(snapshotFiles(staging).meta));
    try {
      await rename(staging, dest);
    } catch (e) {
      await this.cluster?.published(tag, false);
      throw e;
    }
    await fsyncDir(this.root);
    // Read your writes: whoever is told it is made finds it held here through any gateway.
    await this.cluster?.published(tag, true);
    // A background write is told ready when its promise settles (track()).
    if (!this.writing.has(tag)) this.events.emit({ type: "snapshot", tag });
  }

  async list(): Promise<SnapshotMeta[]> {
    const out: SnapshotMeta[] = [];
    for (const name of (await readdir(this.root).catch(() => [] as string[])).sort()) {
      const key = keyOfDir(name);
      if (key === null) continue;
      try {
        const meta = await readMeta(snapshotFiles(join(this.root, name)).meta);
        // A directory whose metadata names another key is not listed as either (get() says so).
        if (meta.tag === key) out.push(meta);
      } catch {
        // A corrupt snapshot is reported by get(), not hidden silently: list what is readable.
      }
    }
    return out;
  }

  /** Reads and verifies a snapshot once (metadata checksum, device-state hash, file sizes). */
  async get(tag: string): Promise<Snapshot> {
    const files = this.filesFor(tag);
    const cached = this.verified.get(tag);
    if (cached) return cached;
    if (!(await exists(files.dir))) throw new ForkdError("not_found", `no snapshot tagged ${tag}`, { tag });
    const meta = await readMeta(files.meta);
    if (meta.tag !== tag) throw new ForkdError("snapshot_corrupt", `snapshot ${tag} claims tag ${meta.tag}`);
    if (meta.parent) {
      // Its disk layer is stacked on the parent's: the parent must be the one it was taken from.
      const parent = await this.get(meta.parent.tag).catch((e: unknown) => {
        throw new ForkdError(
          "snapshot_corrupt",
          `snapshot ${tag}: its parent ${meta.parent?.tag} is unusable`,
          {
            tag,
            parent: meta.parent?.tag,
            cause: e instanceof Error ? e.message : String(e),
          },
        );
      });
      if (parent.meta.checksum !== meta.parent.checksum) {
        throw new ForkdError(
          "snapshot_corrupt",
          `snapshot ${tag}: its parent ${meta.parent.tag} has changed`,
          {
            tag,
          },
        );
      }
    }
    const vm = await sha256File(files.vmstate).catch(() => null);
    if (!vm || vm.sha256 !== meta.files.vmstate.sha256) {
      throw new ForkdError("snapshot_corrupt", `snapshot ${tag}: device state does not match its checksum`, {
        tag,
      });
    }
    if (meta.memoryBase) {
      files.memory = (await this.memoryBaseOf(tag, meta.memoryBase)).files.memory;
      files.memoryDiff = memoryDiffFile(files.dir);
    }
    for (const [name, path, size] of [
      ["memory", files.memory, meta.files.memory.size],
      ["disk", files.disk, meta.files.disk.size],
      ...(files.memoryDiff && meta.files.memoryDiff
        ? [["memory diff", files.memoryDiff, meta.files.memoryDiff.size] as const]
        : []),
    ] as const) {
      const st = await stat(path).catch(() => null);
      if (!st || st.size !== size) {
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

  /**
   * The snapshot whose full image a diff snapshot's diff is relative to: verified, itself a full
   * image, with the memory sha256 recorded (its metadata may be rewritten, e.g. flattened in
   * place; its image never changes).
   */
  private async memoryBaseOf(tag: string, base: { tag: string; checksum: string }): Promise<Snapshot> {
    const b = await this.get(base.tag).catch((e: unknown) => {
      throw new ForkdError("snapshot_corrupt", `snapshot ${tag}: its memory base ${base.tag} is unusable`, {
        tag,
        memory_base: base.tag,
        cause: e instanceof Error ? e.message : String(e),
      });
    });
    if (b.meta.memoryBase || b.meta.files.memory.sha256 !== base.checksum) {
      throw new ForkdError("snapshot_corrupt", `snapshot ${tag}: its memory base ${base.tag} has changed`, {
        tag,
        memory_base: base.tag,
      });
    }
    return b;
  }

  /**
   * A snapshot's place in its chain and what it costs: depth (0 for a cold-booted base),
   * ancestors (nearest first), direct dependents, logical size (what a child sees: RAM + disk)
   * and physical size (blocks its own files use on the host).
   */
  async info(tag: string): Promise<SnapshotInfo> {
    const snap = await this.get(tag);
    const all = await this.list();
    const byTag = new Map(all.map((m) => [m.tag, m]));
    const ancestors: string[] = [];
    for (let p = snap.meta.parent?.tag; p; p = byTag.get(p)?.parent?.tag) {
      if (ancestors.includes(p) || ancestors.length > 1000) break; // a cycle cannot be built, but never loop
      ancestors.push(p);
    }
    let physical = 0;
    // Its own files: a diff snapshot's diff, not the base image its children map.
    for (const f of [
      snap.files.memoryDiff ?? snap.files.memory,
      snap.files.vmstate,
      snap.files.disk,
      snap.files.childDisk,
      snap.files.meta,
    ]) {
      const st = await stat(f).catch(() => null);
      if (st) physical += st.blocks * 512;
    }
    return {
      tag,
      depth: ancestors.length,
      ancestors,
      dependents: all.filter((m) => m.parent?.tag === tag).map((m) => m.tag),
      logical_bytes: snap.meta.files.memory.size + snap.meta.diskSize,
      physical_bytes: physical,
    };
  }

  /** The directories a child of `snap` reads: its own and its ancestors' (disk layers stack). */
  async chainDirs(snap: Snapshot): Promise<string[]> {
    const dirs = [snap.files.dir];
    for (let p = snap.meta.parent?.tag; p && dirs.length <= 1000;) {
      const parent = await this.get(p);
      dirs.push(parent.files.dir);
      p = parent.meta.parent?.tag;
    }
    return dirs;
  }

  /** Drops a cached verification (its files changed: see chain.ts flattenInPlace). */
  forget(tag: string): void {
    this.verified.delete(tag);
  }

  /** Snapshots whose own layers stack on `tag` (branches of it). */
  async dependents(tag: string): Promise<string[]> {
    return (await this.list()).filter((m) => m.parent?.tag === tag).map((m) => m.tag);
  }

  /** Diff snapshots whose memory is relative to `tag`'s image (its children map that image). */
  async memoryDependents(tag: string): Promise<string[]> {
    return (await this.list()).filter((m) => m.memoryBase?.tag === tag).map((m) => m.tag);
  }

  /** Refuses (conflict) while branches stack on `tag` or map its memory image. */
  async assertNoDependents(tag: string): Promise<void> {
    const deps = [...new Set([...(await this.dependents(tag)), ...(await this.memoryDependents(tag))])];
    if (deps.length > 0) {
      throw new ForkdError(
        "conflict",
        `snapshot ${tag} has dependents (branches stacked on it): ${deps.join(", ")}; delete them first`,
        { tag, dependents: deps },
      );
    }
  }

  /** Deletes a snapshot: renamed away first (atomic disappearance), then removed. */
  async delete(tag: string): Promise<void> {
    const dir = this.dirOf(tag);
    if (this.busy.has(tag)) throw new ForkdError("conflict", `snapshot ${tag} is busy`, { tag });
    if (!(await exists(dir))) {
      if ((await this.pending(tag))?.status === "failed") {
        await rm(this.failedPath(tag), { force: true });
        this.events.emit({ type: "snapshot-gone", tag });
        return;
      }
      throw new ForkdError("not_found", `no snapshot tagged ${tag}`, { tag });
    }
    await this.assertNoDependents(tag);
    this.busy.add(tag);
    try {
      const trash = this.stagingDir(`deleted-${tag}-${Date.now()}`);
      await rename(dir, trash);
      this.verified.delete(tag);
      this.cluster?.deleted(tag);
      await fsyncDir(this.root);
      this.events.emit({ type: "snapshot-gone", tag });
      await rm(trash, { recursive: true, force: true });
    } finally {
      this.busy.delete(tag);
    }
  }
}

async function readStagingStatus(dir: string): Promise<StagingStatus | null> {
  try {
    const v = StagingStatusSchema.safeParse(JSON.parse(await readFile(join(dir, "status.json"), "utf8")));
    return v.success ? v.data : null;
  } catch {
    return null;
  }
}
