/**
 * What a gateway is given (the process wiring, src/daemon/gateway.ts, builds it; tests build it
 * over a fake etcd and fake nodes): etcd and the view of it, the caller's authentication, the
 * cluster quota, console sessions, metrics, bounds. And what it keeps while requests run, none
 * of it state: children it sent to a node its record does not show yet (placement counts them),
 * relays open to each node (cut when the node leaves the cluster), listeners of the cluster's
 * changes (event streams).
 */
import type { SecureContext } from "node:tls";
import type { AuthFailureLimiter, Caller, SealedSessions } from "../access/index.js";
import type {
  CatalogEntry,
  ClusterKeys,
  ClusterQuota,
  ClusterView,
  SandboxLocation,
} from "../cluster/index.js";
import type { UsedTickets } from "../cluster/index.js";
import type { Kv, MirrorChange } from "../etcd/index.js";
import type { GatewayMetrics } from "../metrics/index.js";
import type { Logger } from "../util/index.js";
import type { NodePool } from "./node-pool.js";

/** Who a bearer token is (the cluster's token store; tests: a fixed map). */
export interface BearerAuth {
  /** The caller of an `Authorization` header's bearer token; null: none of the cluster's. */
  authenticate(header: string | undefined): Caller | null;
  /** Waits (bounded) until a bearer made a moment ago elsewhere in the cluster is known here. */
  fresh(header: string | undefined): Promise<void>;
}

export interface GatewayBounds {
  /** A connection to a node (default 5 s). */
  connectMs: number;
  /** A relayed call's reply headers (default 15 min: a node's longest call, a build). */
  replyMs: number;
  /** A fork's part on one node (default 15 min: it may pull the snapshot first). */
  forkMs: number;
  /** One node's part of a listing, an event stream's start (default 10 s). */
  listMs: number;
  /** A body the gateway reads to decide (a fork's, a login's, E2B's create; default 1 MiB). */
  bodyBytes: number;
  /** An upgrade's answer from its node (default 60 s). */
  upgradeMs: number;
}

export const DEFAULT_BOUNDS: GatewayBounds = {
  connectMs: 5_000,
  replyMs: 15 * 60_000,
  forkMs: 15 * 60_000,
  listMs: 10_000,
  bodyBytes: 1 << 20,
  upgradeMs: 60_000,
};

export interface GatewayDeps {
  kv: Kv;
  keys: ClusterKeys;
  view: ClusterView;
  auth: BearerAuth;
  quota: ClusterQuota;
  /** The bearer of ADMITTED_PURPOSE (src/access/cluster-secret.ts): sent with the forks it reserved. */
  admitted: string;
  sessions: SealedSessions;
  tickets: UsedTickets;
  metrics: GatewayMetrics;
  log: Logger;
  /** console/dist (null: the console is not served). */
  consoleDist: string | null;
  version: string;
  authFailures: AuthFailureLimiter;
  bounds: GatewayBounds;
  /** Tags no tenant may take (as nodes: FORKD_RESERVED_TAGS). */
  reserved: ReadonlySet<string>;
  /** The CAs an https node's certificate must chain to (FORKD_NODE_CA_FILE; null: Node's). */
  nodeTrust: SecureContext | null;
}

/**
 * Children sent to each node that its record does not count yet: those not answered, and those
 * answered until the node's record is next rewritten (it counts them then; a node rewrites it up
 * to every 500 ms) or SETTLE_MS passed. Forgetting them at the answer left a window in which
 * placement saw room the node no longer had: 125 of 3,000 children refused near full nodes
 * (bench/cluster-scale.ts, 3 nodes of 1,000).
 */
export class Assignments {
  private readonly byNode = new Map<string, number>();
  /** Releases waiting for each node's next record. */
  private readonly settling = new Map<string, Set<() => void>>();

  constructor(private readonly settleMs = SETTLE_MS) {}

  of(node: string): number {
    return this.byNode.get(node) ?? 0;
  }

  /** Runs `release` (add()'s) once `node`'s record is next rewritten, or settleMs passed. */
  settle(node: string, release: () => void): void {
    const set = this.settling.get(node) ?? new Set<() => void>();
    this.settling.set(node, set);
    const fire = () => {
      clearTimeout(timer);
      set.delete(fire);
      if (set.size === 0 && this.settling.get(node) === set) this.settling.delete(node);
      release();
    };
    const timer = setTimeout(fire, this.settleMs);
    timer.unref();
    set.add(fire);
  }

  /** `node`'s record was rewritten (or it left): the children it answered for are in it. */
  recorded(node: string): void {
    const set = this.settling.get(node);
    if (!set) return;
    this.settling.delete(node);
    for (const fire of [...set]) fire();
  }

  /** Counts `n` children on `node` until the returned function is called. */
  add(node: string, n: number): () => void {
    this.byNode.set(node, this.of(node) + n);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const left = this.of(node) - n;
      if (left > 0) this.byNode.set(node, left);
      else this.byNode.delete(node);
    };
  }
}

/** How long answered children count at most, waiting for their node's record (ms). */
export const SETTLE_MS = 2_000;

/** Relays open to each node, cut together when the node leaves the cluster. */
export class Relays {
  private readonly byNode = new Map<string, Set<() => void>>();

  /** Registers `cut` (ends one relay) for `node`; the returned function unregisters it. */
  open(node: string, cut: () => void): () => void {
    const set = this.byNode.get(node) ?? new Set<() => void>();
    set.add(cut);
    this.byNode.set(node, set);
    return () => {
      set.delete(cut);
      if (set.size === 0 && this.byNode.get(node) === set) this.byNode.delete(node);
    };
  }

  /** Cuts every relay to `node`; how many. */
  cut(node: string): number {
    const set = this.byNode.get(node);
    if (!set) return 0;
    this.byNode.delete(node);
    for (const c of set) {
      try {
        c();
      } catch {
        // one relay's failure to end is its own
      }
    }
    return set.size;
  }

  count(node: string): number {
    return this.byNode.get(node)?.size ?? 0;
  }
}

/** What changes in the cluster, told to whoever listens (event streams). */
export interface ClusterChange {
  sandbox?: MirrorChange<SandboxLocation>;
  catalog?: MirrorChange<CatalogEntry>;
  /** A node came (true) or went (false). */
  node?: { id: string; present: boolean };
}

export class ChangeHub {
  private readonly listeners = new Set<(c: ClusterChange) => void>();

  on(fn: (c: ClusterChange) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  tell(c: ClusterChange): void {
    for (const fn of this.listeners) {
      try {
        fn(c);
      } catch {
        // a listener's failure is its own
      }
    }
  }
}

/** The gateway while it runs: its deps and its request-time bookkeeping. */
export interface Gateway extends GatewayDeps {
  assignments: Assignments;
  /** Connections kept open to the nodes for calls whose answer the gateway reads (./node-pool.ts). */
  pool: NodePool;
  relays: Relays;
  hub: ChangeHub;
}
