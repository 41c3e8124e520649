/**
 * The snapshot service: what the API does with snapshots, each through one call. It owns what
 * goes with each operation beyond the store: a new snapshot's warm pool is pre-started, a
 * deleted one's drained and its use by sandboxes checked first, packs and pulls land in the
 * cache directory's image paths with this host's accelerator and the unpack limit, progress
 * lines are logged.
 */
import type { Readable } from "node:stream";
import type { CrashPoint } from "../util/crash.js";
import { ForkdError } from "../util/errors.js";
import type { Logger } from "../util/log.js";
import { compactSnapshot, deleteSnapshot } from "./chain.js";
import { createSnapshot } from "./create.js";
import { createFromDockerfile, defaultResolver } from "./dockerfile.js";
import type { DockerfileSnapshotRequest } from "./dockerfile.js";
import type { BuildNetwork, FromResolver } from "../image/dockerfile/build.js";
import type { CreateSnapshotRequest, SnapshotDeps } from "./create.js";
import type { SnapshotMeta } from "./meta.js";
import { packSnapshot } from "./pack.js";
import type { Registered, UnpackDeps } from "./pack.js";
import { pullSnapshot } from "./pull.js";
import type { PullRequest, PullResult } from "./pull.js";
import { pushSnapshot } from "./push.js";
import type { Progress } from "./progress.js";
import type { PushResult, TransferDeps } from "./push.js";
import type { Snapshot, SnapshotInfo, SnapshotPending, SnapshotStore } from "./store.js";
import { unpackSnapshot } from "./unpack.js";

/** What the snapshot service needs of the sandbox service (SandboxService). */
export interface SnapshotUsers {
  /** Pre-starts VMMs for a new snapshot, so its first fork is as fast as later ones. */
  prewarm(tag: string): void;
  /** Sandboxes running, paused or starting from `tag`. */
  countByTag(tag: string): number;
  /** Drains `tag`'s warm pool before its snapshot is deleted. */
  forgetSnapshot(tag: string): Promise<void>;
}

export interface SnapshotServiceOptions {
  store: SnapshotStore;
  /** What building a snapshot uses (the VMM driver, the image builder, ...). */
  create: SnapshotDeps;
  /** Push and pull: the blob digest cache, the registry settings, the unpack limit. */
  transfer: TransferDeps;
  /** Guest images: built in <cacheDir>/images, from packs in <cacheDir>/imported (image/content.ts). */
  cacheDir: string;
  /** This host's accelerator: a pack restores only into the same kind of machine. */
  accel: "kvm" | "tcg";
  sandboxes: SnapshotUsers;
  log: Logger;
  /** Test-only fault injection (src/util/crash.ts). */
  crash?: CrashPoint;
  /** Dockerfile FROM for references other than forkd://TEMPLATE (the OCI puller; absent: refused). */
  resolveImage?: FromResolver;
  /** The network of Dockerfile build VMs (absent: none). */
  buildNetwork?: BuildNetwork;
}

export class SnapshotService {
  constructor(private readonly o: SnapshotServiceOptions) {}

  /** Ready snapshots, and those being written or failed (pending). */
  async list(): Promise<{ snapshots: SnapshotMeta[]; pending: SnapshotPending[] }> {
    return { snapshots: await this.o.store.list(), pending: await this.o.store.listPending() };
  }

  /** The ready snapshot `tag` (not_found, or snapshot_corrupt). */
  get(tag: string): Promise<Snapshot> {
    return this.o.store.get(tag);
  }

  has(tag: string): Promise<boolean> {
    return this.o.store.has(tag);
  }

  /** `tag` while it is being written or after it failed (null: neither). */
  pending(tag: string): Promise<SnapshotPending | null> {
    return this.o.store.pending(tag);
  }

  /** Sizes, chain and dependents of `tag`. */
  info(tag: string): Promise<SnapshotInfo> {
    return this.o.store.info(tag);
  }

  /** Refuses a creation at once (a taken tag, an unknown template), before any work starts. */
  async checkCreatable(tag: string, template: string): Promise<void> {
    await this.o.create.images.assertKnown(template);
    if (await this.o.store.has(tag))
      throw new ForkdError("conflict", `snapshot ${tag} already exists`, { tag });
  }

  /**
   * Builds snapshot `req.tag` (boot, warm, freeze) and pre-starts its warm pool. `progress`
   * hears each step (logged too). When `unwatched()` says nobody waits for the outcome any more,
   * a failure is recorded in the pending list (a conflict is another creation's tag: not).
   */
  async create(
    req: CreateSnapshotRequest,
    progress: Progress = () => undefined,
    unwatched: () => boolean = () => false,
  ): Promise<SnapshotMeta> {
    const started = new Date().toISOString();
    try {
      const meta = await createSnapshot(this.o.create, req, (line, detail) => {
        this.o.log.info(`snapshot ${req.tag}: ${line}`);
        progress(line, detail);
      });
      this.o.sandboxes.prewarm(meta.tag);
      return meta;
    } catch (e) {
      if (unwatched() && !(e instanceof ForkdError && e.code === "conflict")) {
        await this.o.store
          .recordFailed({ tag: req.tag, started, source: null, owner: req.owner ?? null }, e)
          .catch((err: unknown) => this.o.log.warn("snapshot failure not recorded", { error: String(err) }));
      }
      throw e;
    }
  }

  /**
   * Builds `req.dockerfile` of the build context `context` (a tar stream) step by step, then
   * snapshots the result like create() (image/dockerfile/build.ts, snapshot/dockerfile.ts).
   */
  async createFromDockerfile(
    req: DockerfileSnapshotRequest,
    context: AsyncIterable<Uint8Array>,
    progress: Progress = () => undefined,
    unwatched: () => boolean = () => false,
  ): Promise<SnapshotMeta> {
    const started = new Date().toISOString();
    const logged: Progress = (line, detail) => {
      this.o.log.info(`snapshot ${req.tag}: ${line}`);
      progress(line, detail);
    };
    try {
      const r = await createFromDockerfile(
        {
          create: this.o.create,
          cacheDir: this.o.cacheDir,
          resolve: defaultResolver(this.o.create.images, this.o.resolveImage),
          ...(this.o.buildNetwork ? { network: this.o.buildNetwork } : {}),
          snapshot: (c, p) => this.create(c, p),
        },
        req,
        context,
        logged,
      );
      return r.meta;
    } catch (e) {
      if (unwatched() && !(e instanceof ForkdError && e.code === "conflict")) {
        await this.o.store
          .recordFailed({ tag: req.tag, started, source: null, owner: req.owner }, e)
          .catch((err: unknown) => this.o.log.warn("snapshot failure not recorded", { error: String(err) }));
      }
      throw e;
    }
  }

  /** Streams `tag`'s pack (tar + zstd) into `out`. */
  pack(tag: string, out: NodeJS.WritableStream): Promise<void> {
    return packSnapshot(this.o.store, tag, out, this.o.crash);
  }

  /** Registers the snapshots of the pack `input`, owned by `owner` (null: shared). */
  unpack(input: Readable, owner: string | null): Promise<Registered> {
    return unpackSnapshot(this.unpackDeps(owner), input);
  }

  /** Pushes `tag` to the registry reference `ref`. */
  push(
    tag: string,
    ref: string,
    o: { insecure: boolean },
    progress: Progress = () => undefined,
  ): Promise<PushResult> {
    return pushSnapshot(this.o.transfer, tag, ref, o, (line, detail) => {
      this.o.log.info(`push ${tag}: ${line}`);
      progress(line, detail);
    });
  }

  /** Pulls a snapshot (and its chain) from a registry or a URL, owned by `owner`. */
  pull(req: PullRequest, owner: string | null, progress: Progress = () => undefined): Promise<PullResult> {
    // (No fault injection in a pull: its crash points are an unpack's.)
    const { crash: _c, ...deps } = this.unpackDeps(owner);
    return pullSnapshot({ ...this.o.transfer, ...deps }, req, (line, detail) => {
      this.o.log.info(`pull: ${line}`);
      progress(line, detail);
    });
  }

  /** A new base snapshot `newTag` with `tag`'s state and no parent. */
  compact(tag: string, newTag: string): Promise<SnapshotMeta> {
    return compactSnapshot(this.o.store, tag, newTag);
  }

  /**
   * Deletes `tag` (never one sandboxes use; `cascade`: with its subtree, `force`: its dependents
   * flattened first), draining each deleted tag's warm pool first.
   */
  delete(
    tag: string,
    o: { cascade: boolean; force: boolean },
  ): Promise<{ cascaded?: string[]; orphaned?: string[] }> {
    return deleteSnapshot(this.o.store, tag, o, {
      inUse: (t) => this.o.sandboxes.countByTag(t),
      beforeDelete: (t) => this.o.sandboxes.forgetSnapshot(t),
    });
  }

  private unpackDeps(owner: string | null): UnpackDeps {
    return {
      store: this.o.store,
      cacheDir: this.o.cacheDir,
      maxBytes: this.o.transfer.unpackMaxBytes ?? null,
      accel: this.o.accel,
      owner,
      crash: this.o.crash,
    };
  }
}
