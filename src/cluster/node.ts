/**
 * A forkd node in a cluster (`forkd daemon` with FORKD_CLUSTER): the daemon's services as a
 * member of the cluster in etcd. It joins under a lease (membership.ts) and, while a member,
 * publishes what it holds (holdings.ts), catalogs what it makes (catalog.ts), records where
 * its sandboxes run (locations.ts), removes copies the cluster deleted (removals.ts) and
 * fetches what it lacks (ensure.ts); at start and after every re-join it reconciles its
 * sandboxes and snapshots with the cluster before taking new work. It is the cluster the
 * snapshot store and the sandbox service are given (src/snapshot/cluster.ts,
 * src/sandbox/cluster.ts); a daemon alone has none. docs/cluster.md, "Nodes".
 */
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import type { Kv, KvLease } from "../etcd/index.js";
import { PrefixMirror } from "../etcd/index.js";
import type { CoreEvent, EventBus } from "../events/index.js";
import type { ReadonlySandbox, SandboxCluster, SandboxService } from "../sandbox/index.js";
import type {
  KeyEntry,
  SnapshotCluster,
  SnapshotMeta,
  SnapshotService,
  SnapshotStore,
} from "../snapshot/index.js";
import { ForkdError, errorMessage, sleep } from "../util/index.js";
import type { Logger } from "../util/index.js";
import { freeMemoryMiB, hostCores, hostMemoryMiB } from "./capacity.js";
import { CatalogGuard } from "./catalog.js";
import type { NodeContext } from "./context.js";
import { deleteInCluster } from "./deleting.js";
import { SnapshotFetch, peerTransferUnavailable } from "./ensure.js";
import type { PeerPull, RegistryPull } from "./ensure.js";
import { Fence, cutOff } from "./fence.js";
import { HeldDigests } from "./held-digests.js";
import { Holdings } from "./holdings.js";
import type { ClusterKeys } from "./keys.js";
import { Locations } from "./locations.js";
import { Membership } from "./membership.js";
import type { NodeSelf } from "./membership.js";
import { CatalogEntry, parseRecord } from "./records.js";
import type { MachineKind } from "./records.js";
import { recordPush } from "./pushes.js";
import { ClusterQuota } from "./quota.js";
import type { Reservation } from "./quota.js";
import type { PushDone } from "./pushes.js";
import { Removals } from "./removals.js";
import { syncSnapshots } from "./sync.js";

export interface ClusterNodeOptions {
  kv: Kv;
  keys: ClusterKeys;
  /** FORKD_NODE_ID. */
  id: string;
  /** FORKD_NODE_ADDR and FORKD_NODE_E2B_ADDR (origins). */
  api: string;
  e2b: string | null;
  version: string;
  machine: MachineKind;
  /** FORKD_MAX_SANDBOXES. */
  maxSandboxes: number;
  /** Where the node keeps its own files (<data>/cluster). */
  dir: string;
  log: Logger;
  /** A snapshot as the REST API shows it (a catalog entry's view). */
  view: (meta: SnapshotMeta) => Record<string, unknown>;
  /** Fetches a snapshot from its holders (default: peerTransferUnavailable). */
  pull?: PeerPull;
  /** Fetches a snapshot from a registry a node pushed it to, when no peer gave it (default: none). */
  fromRegistry?: RegistryPull;
  ttlSeconds?: number;
  /** How long a start waits for a record of its id (a killed predecessor's) to expire (ms). */
  takenWaitMs?: number;
}

/** The daemon's services the node works for. */
export interface NodeServices {
  store: SnapshotStore;
  sandboxes: SandboxService;
  snapshots: SnapshotService;
  events: EventBus;
}

interface Parts {
  ctx: NodeContext;
  catalog: CatalogGuard;
  holdings: Holdings;
  locations: Locations;
  removals: Removals;
  fetch: SnapshotFetch;
}

/** The node record is rewritten this often without a change of load (its free memory moves). */
const REFRESH_MS = 15_000;
/** How long a new snapshot's creation waits for its holding to be written (then it answers anyway). */
const HOLDING_WRITE_MS = 5_000;

export class ClusterNode implements SnapshotCluster, SandboxCluster {
  readonly member: Membership;
  private parts: Parts | null = null;
  private services: NodeServices | null = null;
  private unsubscribe: (() => void) | null = null;
  private refresh: NodeJS.Timeout | null = null;
  private closed = false;

  private readonly quota: ClusterQuota;

  constructor(private readonly o: ClusterNodeOptions) {
    this.quota = new ClusterQuota({
      kv: o.kv,
      keys: o.keys,
      lease: async () => {
        const lease = this.member.lease;
        if (!lease) throw cutOff("a fork of a tenant", "this node holds no lease");
        return lease;
      },
    });
    this.member = new Membership({
      kv: o.kv,
      keys: o.keys,
      id: o.id,
      ...(o.ttlSeconds !== undefined ? { ttlSeconds: o.ttlSeconds } : {}),
      ...(o.takenWaitMs !== undefined ? { takenWaitMs: o.takenWaitMs } : {}),
      self: () => this.self(),
      log: o.log,
      joined: (lease) => this.joined(lease),
    });
  }

  get id(): string {
    return this.o.id;
  }

  /** Joins the cluster and reconciles; throws when etcd does not answer or the id is taken. */
  async start(s: NodeServices): Promise<void> {
    const { kv, keys, log } = this.o;
    this.services = s;
    const held = new HeldDigests(join(this.o.dir, "held.json"));
    const problem = await held.load();
    if (problem) log.warn("cluster: held digests unreadable; starting over", { error: problem });
    const warn = (what: string) => log.warn(`cluster: ${what}`);
    const catalog = new PrefixMirror<CatalogEntry>({
      kv,
      prefix: keys.catalog,
      parse: (k, v) => {
        const e = parseRecord(CatalogEntry, v);
        return e && keys.catalogEntry(e.key) === k ? e : null;
      },
      onChange: (ch) => this.catalogChanged(ch.value ?? ch.previous, ch.value),
      onProblem: warn,
    });
    const ctx: NodeContext = {
      kv,
      keys,
      id: this.o.id,
      log,
      machine: this.o.machine,
      member: this.member,
      fence: new Fence(kv, keys.node(this.o.id), () => this.member.lease),
      held,
      catalog,
      store: s.store,
      sandboxes: s.sandboxes,
      snapshots: s.snapshots,
      view: this.o.view,
    };
    const guard = new CatalogGuard(ctx);
    this.parts = {
      ctx,
      catalog: guard,
      holdings: new Holdings(ctx),
      locations: new Locations(ctx),
      removals: new Removals(ctx),
      fetch: new SnapshotFetch(
        ctx,
        guard,
        this.o.pull ?? peerTransferUnavailable,
        this.o.fromRegistry ?? null,
      ),
    };
    try {
      await catalog.start();
      held.joinCluster(await this.clusterId());
      this.unsubscribe = s.events.subscribe((e) => this.onEvent(e));
      await this.member.start();
    } catch (e) {
      await this.close();
      throw e;
    }
    this.refresh = setInterval(() => this.member.update(), REFRESH_MS);
    this.refresh.unref();
    log.info("cluster: joined", {
      node: this.o.id,
      lease: this.member.lease?.id,
      ttl_s: this.member.ttlSeconds,
      catalog: catalog.size,
    });
  }

  /**
   * Leaves the cluster: pending writes get a moment, then the lease is revoked (its node record
   * and holdings vanish at once; its sandboxes' locations stay, for the next start to reconcile).
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.unsubscribe?.();
    if (this.refresh) clearInterval(this.refresh);
    const p = this.parts;
    if (p) {
      if (this.member.admitted)
        await Promise.race([Promise.all([p.locations.flushNow(), p.holdings.flushNow()]), sleep(3000)]);
      p.locations.close();
      p.holdings.close();
      p.removals.close();
    }
    await this.member.close();
    await p?.ctx.catalog.close();
    await p?.removals.settled();
    await p?.ctx.held.settled();
  }

  // The sandbox service's cluster (src/sandbox/cluster.ts).

  admit(what: string): void {
    this.member.admit(what);
  }

  async ensureSnapshot(tag: string): Promise<void> {
    await this.part().fetch.ensure(tag);
  }

  async recordForked(children: ReadonlySandbox[]): Promise<void> {
    await this.part().locations.recordForked(children);
  }

  // The snapshot store's and service's cluster (src/snapshot/cluster.ts).

  async claim(tag: string): Promise<void> {
    await this.part().catalog.claim(tag);
  }

  async publishing(tag: string, meta: SnapshotMeta): Promise<void> {
    await this.part().catalog.publishing(tag, meta);
  }

  async published(tag: string, ok: boolean): Promise<void> {
    const p = this.parts;
    if (!p) return;
    p.catalog.published(tag, ok);
    if (!ok) return;
    // Its holding is written before the creation answers (a GET or a fork through a gateway
    // right after it finds the snapshot here), within a bound: past it the flush goes on alone.
    p.holdings.mark(tag);
    const written = p.holdings.flushNow().catch((e: unknown) => {
      this.o.log.warn("cluster: a new snapshot's holding not written yet", { tag, error: errorMessage(e) });
    });
    await Promise.race([written, sleep(HOLDING_WRITE_MS)]);
  }

  deleted(tag: string): void {
    this.parts?.catalog.deleted(tag);
  }

  lookup(key: string): KeyEntry | undefined {
    return this.parts?.catalog.lookup(key);
  }

  /**
   * Reserves `n` sandboxes of `tenant` against its quota across the cluster (src/cluster/quota.ts),
   * under this node's lease: a fork a tenant sent to this node directly, not through a gateway.
   */
  async reserve(tenant: string, max: number, n: number): Promise<Reservation> {
    return this.quota.reserve(tenant, max, n);
  }

  async pushed(tag: string, chain: string[], p: PushDone): Promise<void> {
    const parts = this.parts;
    if (parts) await recordPush(parts.ctx, tag, chain, p);
  }

  async deleting(tag: string, o: { cascade: boolean; force: boolean }, local: string[]): Promise<string[]> {
    return deleteInCluster(this.part().ctx, tag, o, local);
  }

  /** The parts, once started (before: the node is not a member, and takes no work). */
  private part(): Parts {
    if (!this.parts || this.closed) throw cutOff("this work", "not joined");
    return this.parts;
  }

  private async self(): Promise<NodeSelf> {
    const list = this.services?.sandboxes.list() ?? [];
    return {
      id: this.o.id,
      api: this.o.api,
      e2b: this.o.e2b,
      version: this.o.version,
      machine: this.o.machine,
      capacity: {
        cores: hostCores(),
        memoryMiB: hostMemoryMiB(),
        maxSandboxes: this.o.maxSandboxes,
        running: list.filter((sb) => sb.state === "running").length,
        paused: list.filter((sb) => sb.state === "paused").length,
        freeMemoryMiB: await freeMemoryMiB(),
      },
      draining: false,
    };
  }

  /** After each join: sandboxes and snapshots reconciled, holdings written under the new lease. */
  private async joined(_lease: KvLease): Promise<void> {
    const p = this.part();
    await p.locations.reconcile();
    await syncSnapshots(p.ctx, p.catalog, p.removals, (k) => p.fetch.holders(k));
    await p.holdings.rejoined();
  }

  /** The cluster's name (made by the first node, create-only). */
  private async clusterId(): Promise<string> {
    const key = this.o.keys.clusterId;
    await this.o.kv.txn(
      [{ key, target: "version", op: "==", value: 0 }],
      [{ type: "put", key, value: randomBytes(8).toString("hex") }],
    );
    const v = (await this.o.kv.get(key))?.value ?? "";
    if (!/^[0-9a-f]{16,64}$/.test(v))
      throw new ForkdError("unavailable", `etcd: ${key} does not hold a cluster id`);
    return v;
  }

  private catalogChanged(was: CatalogEntry | null, now: CatalogEntry | null): void {
    const p = this.parts;
    if (!p || !was) return;
    const held = p.ctx.held.get(was.key);
    // A copy held here of what the cluster deleted (or replaced): removed once unused.
    if (held !== undefined && now?.digest !== held) p.removals.add(was.key);
  }

  private onEvent(e: CoreEvent): void {
    const p = this.parts;
    if (!p || this.closed) return;
    try {
      switch (e.type) {
        case "sandbox":
          p.locations.changed(e.sandbox);
          this.member.update();
          if (e.sandbox.state === "exited") p.removals.poke();
          return;
        case "sandbox-gone":
          p.locations.gone(e.id);
          this.member.update();
          p.removals.poke();
          return;
        case "snapshot":
        case "snapshot-gone":
        case "pool":
          p.holdings.mark(e.tag);
          return;
      }
    } catch (err) {
      this.o.log.warn("cluster: an event not followed", { error: errorMessage(err) });
    }
  }
}
