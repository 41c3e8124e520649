/**
 * The snapshot service: what the API does with snapshots, each through one call. It owns what
 * goes with each operation beyond the store: a new snapshot's warm pool is pre-started, a
 * deleted one's drained and its use by sandboxes checked first, packs and pulls land in the
 * cache directory's image paths with this host's accelerator and the unpack limit, progress
 * lines are logged. It decides what a new snapshot boots: a template's guest image, or a pulled
 * image's (the image resolver pulls it, the builder adds forkd's files).
 */
import type { Readable } from "node:stream";
import type { CrashPoint } from "../util/index.js";
import { ForkdError } from "../util/index.js";
import type { Logger } from "../util/index.js";
import { compactSnapshot, deleteSnapshot, planDelete } from "./chain.js";
import type { DeletePlan } from "./chain.js";
import { cancelled, createSnapshot } from "./create.js";
import { createFromDockerfile, defaultResolver } from "./dockerfile.js";
import type { DockerfileSnapshotRequest } from "./dockerfile.js";
import type { BuildNetwork, FromResolver } from "../image/index.js";
import type { NewSnapshotRequest, PreparedImage, SnapshotDeps, SnapshotFrom } from "./create.js";
import type { SnapshotMeta } from "./meta.js";
import type { ImageResolver } from "../image/index.js";
import { envMap } from "../image/index.js";
import { packSnapshot } from "./pack.js";
import type { Registered, UnpackDeps } from "./pack.js";
import { pullPinned, pullSnapshot } from "./pull.js";
import type { PullRequest, PullResult } from "./pull.js";
import { pushSnapshot } from "./push.js";
import type { Progress } from "../util/index.js";
import type { PushResult, TransferDeps } from "./push.js";
import type { Snapshot, SnapshotInfo, SnapshotPending, SnapshotStore } from "./store.js";
import { unpackSnapshot } from "./unpack.js";
import { FileSums } from "./file-sums.js";
import { heldFile } from "./held-files.js";
import { chainOf } from "./chain-files.js";
import type { HeldFile } from "./chain-files.js";
import { peerManifest } from "./peer-manifest.js";
import type { PeerManifest } from "./peer-manifest.js";
import { PEER_PULL_DEFAULTS, PeerPuller } from "./peer-pull.js";
import type { Holder, PeerPullOptions, PeerPullResult } from "./peer-pull.js";
import { assertKey } from "../util/index.js";
import type { PinScope } from "../cache/index.js";
import { Namespaces, reservedTags } from "./namespace.js";
import type { KeyEntry, KeyLookup, Viewer } from "./namespace.js";
import type { Reach } from "../registry/index.js";

/** A request's owner as a registry's reach: the admin's (no owner) is the operator's, a tenant's its own. */
const reachOf = (owner: string | null | undefined): Reach =>
  owner === null || owner === undefined ? "operator" : "tenant";

/** The daemon's part in the shared cache (src/cache/keeper.ts): pins, and collecting after builds. */
export interface CacheUse {
  scope(): PinScope;
  collectSoon(): void;
}

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
  /** Pulls images (src/oci/puller.ts's ImagePuller); null: snapshots from images are unavailable. */
  images?: ImageResolver | null;
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
  /** The network of Dockerfile build VMs (absent: none). */
  buildNetwork?: BuildNetwork;
  /** Pins what operations in progress use in the cache, and collects it (absent: neither). */
  cache?: CacheUse;
  /** Tags no tenant may take (absent: namespace.ts's defaults). */
  reservedTags?: ReadonlySet<string>;
  /**
   * Pulls from peers of the cluster (peer-pull.ts): the cluster secret's peer bearer and the
   * bounds of each exchange (absent: this node pulls from no peer).
   */
  peer?: { bearer: string } & Partial<Omit<PeerPullOptions, "bearer">>;
}

/** Thrown when what an operation was about to use was collected from the cache meanwhile. */
const collected = (what: string) =>
  new ForkdError("unavailable", `${what} was collected from the cache while in use; try again`);

export class SnapshotService {
  /** Tags by namespace: what a caller's tag is in the store (namespace.ts). */
  readonly namespaces: Namespaces;

  /** Sums of files no metadata records (images, meta.json), hashed once (file-sums.ts). */
  private readonly sums = new FileSums();
  /** Pulls from peers, one per key (null: no cluster secret, no peer pulls). */
  private readonly peers: PeerPuller | null;

  constructor(private readonly o: SnapshotServiceOptions) {
    // In a cluster a tag the catalog has is taken and found here too (src/cluster/).
    const keys: KeyLookup = o.store.cluster ? { lookup: (key) => this.lookup(key) } : o.store;
    this.namespaces = new Namespaces(keys, o.reservedTags ?? reservedTags(undefined));
    this.peers = o.peer ? new PeerPuller({ ...PEER_PULL_DEFAULTS, ...o.peer }) : null;
  }

  /** What is at key `key`: here (ready, being written, failed), or in the cluster's catalog. */
  async lookup(key: string): Promise<KeyEntry | undefined> {
    return (await this.o.store.lookup(key)) ?? this.o.store.cluster?.lookup(key);
  }

  /** A conflict when `tag` is published here or (in a cluster) in the catalog. */
  private async assertFree(tag: string): Promise<void> {
    if ((await this.o.store.has(tag)) || this.o.store.cluster?.lookup(tag) !== undefined)
      throw new ForkdError("conflict", `snapshot ${tag} already exists`, { tag });
  }

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

  /**
   * Refuses a creation at once (a taken tag, an unknown template, images without a puller, an
   * image a tenant `owner` may not pull), before any work starts.
   */
  async checkCreatable(tag: string, from: SnapshotFrom, owner: string | null = null): Promise<void> {
    if ("template" in from) await this.o.create.images.assertKnown(from.template);
    else if ("image" in from) await this.resolver().admit?.(from.image, reachOf(owner));
    await this.assertFree(tag);
  }

  private resolver(): ImageResolver {
    if (!this.o.images)
      throw new ForkdError("unavailable", "this daemon cannot pull images (no image puller configured)", {
        field: "image",
      });
    return this.o.images;
  }

  /** The guest image, source and exec defaults of `from`: built (or found cached) now. */
  private async prepare(
    from: SnapshotFrom,
    reach: Reach,
    progress: Progress,
    pins?: PinScope,
    signal?: AbortSignal,
  ): Promise<PreparedImage> {
    if ("prepared" in from) return from.prepared;
    const onLine = (line: string) => progress(line, { phase: "image" });
    if ("template" in from) {
      await this.o.create.images.assertKnown(from.template);
      progress(`image: ensuring template ${from.template}`, { phase: "image" });
      const image = await this.o.create.images.ensure(from.template, onLine, undefined, signal);
      return { image, source: { kind: "template", name: from.template } };
    }
    progress(`image: pulling ${from.image}`, { phase: "pull" });
    let pulled = await this.resolver().ensure(from.image, progress, signal, reach);
    // Its tree is read by the image build: pinned until the snapshot is made (once more if it
    // was collected between the pull and the pin).
    if (pins && !(await pins.pin(pulled.rootfs))) {
      pulled = await this.resolver().ensure(from.image, progress, signal, reach);
      if (!(await pins.pin(pulled.rootfs))) throw collected(`the pulled image ${from.image}`);
    }
    progress(`image: guest image of ${pulled.ref}@${pulled.digest}`, { phase: "image" });
    const image = await this.o.create.images.ensureFromRootfs(pulled, onLine, undefined, signal);
    const cwd = pulled.config.workingDir;
    return {
      image,
      source: { kind: "image", ref: pulled.ref, digest: pulled.digest },
      execDefaults: { env: envMap(pulled.config.env), ...(cwd ? { cwd } : {}) },
    };
  }

  /**
   * Builds snapshot `req.tag` (boot, warm, freeze) and pre-starts its warm pool. `progress`
   * hears each step (logged too). When `unwatched()` says nobody waits for the outcome any more,
   * a failure is recorded in the pending list (a conflict is another creation's tag: not).
   */
  async create(
    req: NewSnapshotRequest,
    progress: Progress = () => undefined,
    unwatched: () => boolean = () => false,
  ): Promise<SnapshotMeta> {
    return this.tracked(req.tag, req.owner ?? null, progress, unwatched, (logged) => this.build(req, logged));
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
    return this.tracked(req.tag, req.owner, progress, unwatched, async (logged) => {
      const pins = this.o.cache?.scope();
      try {
        const r = await createFromDockerfile(
          {
            create: this.o.create,
            cacheDir: this.o.cacheDir,
            ...(pins ? { pin: (path: string) => pins.pin(path) } : {}),
            resolve: defaultResolver(
              this.o.create.images,
              this.o.images ? this.fromImage(this.o.images, reachOf(req.owner), pins) : undefined,
            ),
            ...(this.o.buildNetwork ? { network: this.o.buildNetwork } : {}),
            snapshot: (c, p) => this.build(c, p),
          },
          req,
          context,
          logged,
        );
        return r.meta;
      } finally {
        await pins?.release();
      }
    });
  }

  /** Prepares the guest image, makes the snapshot and pre-starts its warm pool. */
  private async build(req: NewSnapshotRequest, progress: Progress): Promise<SnapshotMeta> {
    // A taken tag before the image is pulled or built (create claims it again, atomically).
    await this.assertFree(req.tag);
    const { from, ...rest } = req;
    // What the snapshot is made from stays pinned in the cache until its meta.json names it.
    const pins = this.o.cache?.scope();
    try {
      const reach = reachOf(req.owner);
      let prepared = await this.prepare(from, reach, progress, pins, req.signal);
      if (pins && !(await pins.pin(prepared.image.dir))) {
        prepared = await this.prepare(from, reach, progress, pins, req.signal); // collected since: built again
        if (!(await pins.pin(prepared.image.dir))) throw collected(`the guest image ${prepared.image.dir}`);
      }
      if (req.signal?.aborted) throw cancelled(req.tag);
      const meta = await createSnapshot(this.o.create, { ...rest, ...prepared }, progress);
      this.o.sandboxes.prewarm(meta.tag);
      return meta;
    } finally {
      await pins?.release();
      this.o.cache?.collectSoon();
    }
  }

  /**
   * Runs a creation of `tag` with its progress logged. When `unwatched()` says nobody waits for
   * the outcome any more, a failure is recorded in the pending list (a conflict is another
   * creation's tag: not).
   */
  private async tracked(
    tag: string,
    owner: string | null,
    progress: Progress,
    unwatched: () => boolean,
    run: (logged: Progress) => Promise<SnapshotMeta>,
  ): Promise<SnapshotMeta> {
    const started = new Date().toISOString();
    // A RUN step's output is not logged (it may be megabytes; the step's "done" line is).
    const logged: Progress = (line, detail) => {
      if (detail?.phase !== "run") this.o.log.info(`snapshot ${tag}: ${line}`);
      progress(line, detail);
    };
    // Listed (and told) as writing while it runs, so the console's tree shows it.
    const ended = await this.o.store.announce({ tag, started, source: null, owner });
    let made = false;
    try {
      const meta = await run(logged);
      made = true;
      return meta;
    } catch (e) {
      if (unwatched() && !(e instanceof ForkdError && e.code === "conflict")) {
        await this.o.store
          .recordFailed({ tag, started, source: null, owner }, e)
          .catch((err: unknown) => this.o.log.warn("snapshot failure not recorded", { error: String(err) }));
      }
      throw e;
    } finally {
      ended(made);
    }
  }

  /**
   * Dockerfile FROM of an image reference: pulled (a tenant's build reaches only what a tenant
   * may), then its guest image built (cached both).
   */
  private fromImage(images: ImageResolver, reach: Reach, pins?: PinScope): FromResolver {
    return async (ref, progress, signal) => {
      let pulled = await images.ensure(ref, progress, signal, reach);
      // Its tree is read by the image build: pinned (pulled again if collected meanwhile).
      if (pins && !(await pins.pin(pulled.rootfs))) {
        pulled = await images.ensure(ref, progress, signal, reach);
        if (!(await pins.pin(pulled.rootfs))) throw collected(`the pulled image ${ref}`);
      }
      progress(`image: guest image of ${pulled.ref}@${pulled.digest}`, { phase: "image" });
      const image = await this.o.create.images.ensureFromRootfs(
        pulled,
        (line) => progress(line, { phase: "image" }),
        undefined,
        signal,
      );
      return {
        image,
        // A pulled image's config has all of these; a test tree's (LocalImages) only the first three.
        config: { entrypoint: null, cmd: null, labels: {}, ...pulled.config },
        source: { kind: "image", ref: pulled.ref, digest: pulled.digest },
      };
    };
  }

  /** Streams `tag`'s pack (tar + zstd) into `out`. */
  pack(tag: string, out: NodeJS.WritableStream): Promise<void> {
    return packSnapshot(this.o.store, tag, out, this.o.crash, this.sums);
  }

  /** What a peer pulling `key` needs (peer-manifest.ts): not_found unless held here, ready. */
  peerManifest(key: string): Promise<PeerManifest> {
    return peerManifest(this.o.store, assertKey(key), this.sums);
  }

  /** The file of a snapshot held here (or of its image) whose sha256 is `sha256` (held-files.ts). */
  heldFile(sha256: string): Promise<HeldFile> {
    return heldFile(this.o.store, this.sums, sha256);
  }

  /**
   * Pulls `key` (its chain and guest image) from the peers `holders()` names, best first,
   * keeping its keys and owners; one pull per key on this node (peer-pull.ts).
   */
  async pullFromPeers(
    key: string,
    holders: () => Promise<Holder[]>,
    progress: Progress = () => undefined,
  ): Promise<PeerPullResult> {
    if (!this.peers)
      throw new ForkdError(
        "unavailable",
        "this node pulls from no peer: it has no cluster secret (FORKD_CLUSTER_SECRET_FILE)",
      );
    const pins = this.o.cache?.scope();
    try {
      const { crash: _c, ...deps } = this.unpackDeps(null, pins);
      return await this.peers.pull(deps, key, holders, (line, detail) => {
        this.o.log.info(`pull ${key} from peers: ${line}`);
        progress(line, detail);
      });
    } finally {
      await pins?.release();
    }
  }

  /** Registers the snapshots of the pack `input` in `viewer`'s namespace (null: an admin's, shared). */
  async unpack(input: Readable, viewer: Viewer): Promise<Registered> {
    const pins = this.o.cache?.scope();
    try {
      return await unpackSnapshot(this.unpackDeps(viewer, pins), input);
    } finally {
      await pins?.release();
    }
  }

  /** Pushes `tag` to the registry reference `ref` (in a cluster, the push is recorded there). */
  async push(
    tag: string,
    ref: string,
    o: { insecure: boolean },
    progress: Progress = () => undefined,
  ): Promise<PushResult> {
    const r = await pushSnapshot(this.o.transfer, tag, ref, o, (line, detail) => {
      this.o.log.info(`push ${tag}: ${line}`);
      progress(line, detail);
    });
    const cluster = this.o.store.cluster;
    if (cluster) {
      const chain = await chainOf(this.o.store, tag).catch(() => null);
      if (chain)
        await cluster.pushed(
          tag,
          chain.map((m) => m.tag),
          { ref: r.ref, digest: r.digest, insecure: o.insecure },
        );
    }
    return r;
  }

  /**
   * Fetches `key`'s chain from the registry a peer of the cluster pushed it to, pinned by the
   * manifest's digest, registered under the catalog's keys and owners (src/cluster/ensure.ts).
   */
  async pullFromRegistry(
    p: { ref: string; digest: string; insecure: boolean; keys: string[]; owners: (string | null)[] },
    progress: Progress = () => undefined,
  ): Promise<PullResult> {
    const pins = this.o.cache?.scope();
    try {
      const { crash: _c, ...deps } = this.unpackDeps(null, pins);
      return await pullPinned({ ...this.o.transfer, ...deps }, p, (line, detail) => {
        this.o.log.info(`pull ${p.keys[p.keys.length - 1] ?? ""} from ${p.ref}: ${line}`);
        progress(line, detail);
      });
    } finally {
      await pins?.release();
    }
  }

  /**
   * Pulls a snapshot (and its chain) from a registry or a URL into `viewer`'s namespace, or
   * (`peer`, an admin's only) key `tag` from that peer node, under the same keys and owners.
   */
  async pull(req: PullRequest, viewer: Viewer, progress: Progress = () => undefined): Promise<PullResult> {
    if (req.peer !== undefined) return this.pullPeerRequest(req, viewer, progress);
    // (No fault injection in a pull: its crash points are an unpack's.)
    const pins = this.o.cache?.scope();
    try {
      const { crash: _c, ...deps } = this.unpackDeps(viewer, pins);
      return await pullSnapshot({ ...this.o.transfer, ...deps }, req, (line, detail) => {
        this.o.log.info(`pull: ${line}`);
        progress(line, detail);
      });
    } finally {
      await pins?.release();
    }
  }

  private async pullPeerRequest(req: PullRequest, viewer: Viewer, progress: Progress): Promise<PullResult> {
    if (viewer !== null)
      throw new ForkdError(
        "forbidden",
        "pulling from a peer node is for admins: it keeps every tenant's keys",
      );
    if (req.tag === undefined || req.ref !== undefined || req.url !== undefined)
      throw new ForkdError(
        "invalid_argument",
        "a pull from a peer names the key to pull (tag), and no ref or url",
        {
          field: "tag",
        },
      );
    const urls = typeof req.peer === "string" ? [req.peer] : (req.peer ?? []);
    const r = await this.pullFromPeers(
      assertKey(req.tag),
      () => Promise.resolve(urls.map((url) => ({ node: url, url }))),
      progress,
    );
    return {
      tag: r.tag,
      published: r.published,
      source: r.from.join(", ") || urls.join(", "),
      digest: null,
      blobs: r.files,
      bytes: r.bytes,
    };
  }

  /** A new base snapshot `newTag` with `tag`'s state and no parent. */
  compact(tag: string, newTag: string): Promise<SnapshotMeta> {
    return compactSnapshot(this.o.store, tag, newTag, this.o.create.tools);
  }

  /**
   * Deletes `tag` (never one sandboxes use; `cascade`: with its subtree, `force`: its dependents
   * flattened first), draining each deleted tag's warm pool first.
   */
  async delete(
    tag: string,
    o: { cascade: boolean; force: boolean },
  ): Promise<{ cascaded?: string[]; orphaned?: string[] }> {
    const cluster = this.o.store.cluster;
    if (!cluster) return deleteSnapshot(this.o.store, tag, o, this.deleteHooks());
    // In a cluster a delete is the cluster's: refused while any node runs from it, then out of
    // the catalog (every node removes its copy), then here. One this node does not hold is
    // removed from the catalog alone.
    if (!(await this.o.store.has(tag)) && (await this.o.store.pending(tag))?.status !== "failed") {
      const gone = await cluster.deleting(tag, o, []);
      return o.cascade ? { cascaded: gone.filter((t) => t !== tag) } : {};
    }
    return deleteSnapshot(this.o.store, tag, o, {
      ...this.deleteHooks(),
      beforeChange: async (tags) => void (await cluster.deleting(tag, o, tags)),
    });
  }

  /**
   * Removes this node's copy of `tag` once the cluster deleted it (src/cluster/): never one
   * sandboxes here use; branches of it that stay in the catalog are flattened first.
   */
  async deleteCopy(tag: string): Promise<void> {
    await deleteSnapshot(this.o.store, tag, { cascade: false, force: true }, this.deleteHooks());
  }

  private deleteHooks() {
    return {
      inUse: (t: string) => this.o.sandboxes.countByTag(t),
      beforeDelete: (t: string) => this.o.sandboxes.forgetSnapshot(t),
      tools: this.o.create.tools,
    };
  }

  /** What delete() with these options would do (nothing is changed). */
  planDelete(tag: string, o: { cascade: boolean; force: boolean }): Promise<DeletePlan> {
    return planDelete(this.o.store, tag, o, (t) => this.o.sandboxes.countByTag(t));
  }

  private unpackDeps(viewer: Viewer, pins?: PinScope): UnpackDeps {
    return {
      ...(pins ? { pin: (path: string) => pins.pin(path) } : {}),
      store: this.o.store,
      cacheDir: this.o.cacheDir,
      tools: this.o.create.tools,
      maxBytes: this.o.transfer.unpackMaxBytes ?? null,
      accel: this.o.accel,
      viewer,
      namespaces: this.namespaces,
      crash: this.o.crash,
    };
  }
}
