/**
 * A gateway put together over an etcd (a Kv): its view of the cluster (mirrors of nodes/,
 * holdings/, catalog/, sandboxes/), its own lease (reservations of the tenant quota live under
 * it; a lost lease is replaced by a new one on the next reservation), the janitor of lost
 * sandboxes (told at once when a node's key goes, and sweeping every `sweepMs`), the sweep of
 * used console tickets, and the handlers of its two doors. When a node leaves the cluster every
 * relay to it is cut and its sandboxes are marked lost. The process wiring (environment,
 * listeners, signals) is src/daemon/gateway.ts; tests build one over a fake etcd.
 */
import type { IncomingMessage, RequestListener } from "node:http";
import type { Duplex } from "node:stream";
import type { SecureContext } from "node:tls";
import { AuthFailureLimiter } from "../access/index.js";
import type { SealedSessions } from "../access/index.js";
import { ClusterQuota, ClusterView, Janitor, UsedTickets } from "../cluster/index.js";
import type { ClusterKeys } from "../cluster/index.js";
import type { Kv, KvLease } from "../etcd/index.js";
import { GatewayMetrics } from "../metrics/index.js";
import { errorMessage } from "../util/index.js";
import type { Logger } from "../util/index.js";
import { Assignments, ChangeHub, DEFAULT_BOUNDS, Relays } from "./context.js";
import type { BearerAuth, Gateway, GatewayBounds } from "./context.js";
import { e2bHandler, e2bUpgrade } from "./e2b.js";
import { closePool, nodePool } from "./node-pool.js";
import { restHandler, restUpgrade } from "./rest.js";

export interface GatewayOptions {
  kv: Kv;
  keys: ClusterKeys;
  auth: BearerAuth;
  sessions: SealedSessions;
  /** The cluster secret's bearer of ADMITTED_PURPOSE: nodes do not reserve a fork's children again. */
  admitted: string;
  log: Logger;
  version: string;
  consoleDist?: string | null;
  bounds?: Partial<GatewayBounds>;
  reserved?: ReadonlySet<string>;
  /** Failed authentications per address (default: 1 per second, bursts of 20). */
  authFailures?: AuthFailureLimiter;
  /** The janitor's sweep (default 10 s). */
  sweepMs?: number;
  /** The TTL of the gateway's own lease (default 10 s). */
  leaseTtlS?: number;
  /** Lost records are forgotten this long after they were marked (default 24 h). */
  lostKeepMs?: number;
  /** The CAs an https node's certificate must chain to, besides Node's (FORKD_NODE_CA_FILE). */
  nodeTrust?: SecureContext | null;
}

type UpgradeListener = (req: IncomingMessage, socket: Duplex, head: Buffer) => void;

export interface RunningGateway {
  gateway: Gateway;
  janitor: Janitor;
  rest: RequestListener;
  restUpgrade: UpgradeListener;
  e2b: RequestListener;
  e2bUpgrade: UpgradeListener;
  /** Stops following etcd and the janitor; revokes the gateway's lease. Bounded, never throws. */
  close(): Promise<void>;
}

/** The gateway's own lease, granted when first needed and again after it was lost. */
class OwnLease {
  private current: Promise<KvLease> | null = null;
  constructor(
    private readonly kv: Kv,
    private readonly ttl: number,
    private readonly log: Logger,
  ) {}

  get(): Promise<KvLease> {
    if (this.current) return this.current;
    const p = this.kv.grantLease(this.ttl).then((l) => {
      l.onLost((why) => {
        this.log.warn("gateway: its lease was lost; a new one is granted when next needed", { why });
        if (this.current === p) this.current = null;
      });
      return l;
    });
    p.catch(() => {
      if (this.current === p) this.current = null;
    });
    this.current = p;
    return p;
  }

  async revoke(): Promise<void> {
    const p = this.current;
    this.current = null;
    if (p) await p.then((l) => l.revoke()).catch(() => undefined);
  }
}

export async function startGateway(o: GatewayOptions): Promise<RunningGateway> {
  const hub = new ChangeHub();
  const relays = new Relays();
  const assignments = new Assignments();
  const log = o.log;
  // Set once the janitor exists (the view tells it of nodes that go).
  const janitorRef: { j: Janitor | null } = { j: null };
  const view = new ClusterView({
    kv: o.kv,
    keys: o.keys,
    onProblem: (what) => log.warn("gateway: etcd", { what }),
    onNodeGone: (n) => {
      assignments.recorded(n.id);
      const cut = relays.cut(n.id);
      log.warn("gateway: a node left the cluster", { node: n.id, relays_cut: cut });
      hub.tell({ node: { id: n.id, present: false } });
      void janitorRef.j?.nodeGone(n);
    },
    onNode: (n, joined) => {
      assignments.recorded(n.id);
      if (joined) hub.tell({ node: { id: n.id, present: true } });
    },
    onSandbox: (c) => hub.tell({ sandbox: c }),
    onCatalog: (c) => hub.tell({ catalog: c }),
  });
  const metrics = new GatewayMetrics({
    version: o.version,
    nodes: () => view.nodesMirror.size,
    sandboxStates: () => {
      const by: Record<string, number> = {};
      for (const r of view.sandboxesMirror.values()) by[r.state] = (by[r.state] ?? 0) + 1;
      return by;
    },
    live: () => view.live,
  });
  const lease = new OwnLease(o.kv, o.leaseTtlS ?? 10, log);
  const janitor = new Janitor({
    kv: o.kv,
    keys: o.keys,
    present: (id) => view.node(id) !== undefined,
    records: () => view.sandboxesMirror.values(),
    record: (id) => view.sandboxesMirror.get(o.keys.sandbox(id)),
    ...(o.lostKeepMs !== undefined ? { lostKeepMs: o.lostKeepMs } : {}),
    log: (msg, fields) => log.info(msg, fields),
    onMarked: () => metrics.markedLost(),
  });
  janitorRef.j = janitor;
  const tickets = new UsedTickets(o.kv, o.keys);
  const gateway: Gateway = {
    kv: o.kv,
    keys: o.keys,
    view,
    auth: o.auth,
    quota: new ClusterQuota({ kv: o.kv, keys: o.keys, lease: () => lease.get() }),
    admitted: o.admitted,
    sessions: o.sessions,
    tickets,
    metrics,
    log,
    consoleDist: o.consoleDist ?? null,
    version: o.version,
    authFailures: o.authFailures ?? new AuthFailureLimiter({ rps: 1, burst: 20 }),
    bounds: { ...DEFAULT_BOUNDS, ...o.bounds },
    reserved: o.reserved ?? new Set(),
    nodeTrust: o.nodeTrust ?? null,
    assignments,
    pool: nodePool(),
    relays,
    hub,
  };
  await view.start();
  // Nodes that left while no gateway watched: the first sweep now, then every sweepMs.
  const sweep = async () => {
    try {
      await janitor.sweep();
      await tickets.sweep();
    } catch (e) {
      log.warn("gateway: the janitor's sweep failed (it runs again)", { error: errorMessage(e) });
    }
  };
  void sweep();
  const timer = setInterval(() => void sweep(), o.sweepMs ?? 10_000);
  timer.unref();
  let closed = false;
  return {
    gateway,
    janitor,
    rest: restHandler(gateway),
    restUpgrade: restUpgrade(gateway),
    e2b: e2bHandler(gateway),
    e2bUpgrade: e2bUpgrade(gateway),
    async close() {
      if (closed) return;
      closed = true;
      clearInterval(timer);
      closePool(gateway.pool);
      await view.close().catch(() => undefined);
      await lease.revoke();
    },
  };
}
