/**
 * The janitor of lost sandboxes (docs/cluster.md, "Failure model"): when a node's key goes (its
 * lease expired: the node died, or was cut off from etcd for longer than its TTL), every
 * sandboxes/<id> of that node still `running` or `paused` becomes `lost` with a reason ("node n2
 * stopped answering the cluster at <time>"), and its index keys (by-node/, by-owner/) go. Each
 * record is changed in one transaction that holds only if the record is still the one read (its
 * mod revision) and the node is still absent (a node back under the same id keeps its
 * sandboxes): so any number of gateways may run it at once, and each record is marked once.
 *
 * A periodic sweep does the same for records of nodes absent from the cluster (a gateway that
 * was down when the node went, a record written after it), drops index keys of absent nodes left
 * without a live record, and forgets `lost` records older than `lostKeepMs`, and `exited` ones
 * as old of nodes absent (a node removes its own once it removed the sandbox; an absent one
 * never will).
 */
import type { Kv } from "../etcd/index.js";
import { errorMessage } from "../util/index.js";
import type { ClusterKeys } from "./keys.js";
import { NODE_ID_RE, SANDBOX_ID_RE } from "./keys.js";
import { SandboxLocation, parseRecord } from "./records.js";
import type { NodeRecord } from "./records.js";

export interface JanitorOptions {
  kv: Kv;
  keys: ClusterKeys;
  /** Whether node `id` is in the cluster now (the gateway's mirror of nodes/). */
  present: (id: string) => boolean;
  /** Every sandbox record the gateway mirrors (the sweep's candidates). */
  records: () => Iterable<SandboxLocation>;
  now?: () => number;
  /** Records changed at once. */
  parallel?: number;
  /** Lost records are forgotten this long after they were marked (default 24 h). */
  lostKeepMs?: number;
  log?: (msg: string, fields: Record<string, unknown>) => void;
  /** Told each record marked lost. */
  onMarked?: (r: SandboxLocation) => void;
}

export const LOST_KEEP_MS = 24 * 3_600_000;
const LIVE = new Set(["running", "paused"]);

export const lostReason = (node: string, at: number): string =>
  `node ${node} stopped answering the cluster at ${new Date(at).toISOString()}`;

export class Janitor {
  private readonly now: () => number;
  /** Nodes being handled now: a second notice of the same node waits for the first. */
  private readonly running = new Map<string, Promise<number>>();

  constructor(private readonly o: JanitorOptions) {
    this.now = o.now ?? (() => Date.now());
  }

  /** A node's key went: its sandboxes are marked lost. Resolves to how many this call marked. */
  nodeGone(node: NodeRecord | string): Promise<number> {
    const id = typeof node === "string" ? node : node.id;
    const prior = this.running.get(id) ?? Promise.resolve(0);
    const next = prior
      .catch(() => 0)
      .then(() => this.markNode(id, lostReason(id, this.now())))
      .finally(() => {
        if (this.running.get(id) === next) this.running.delete(id);
      });
    this.running.set(id, next);
    return next;
  }

  /** Marks lost every live record of absent node `node` (by its by-node/ keys and the mirror). */
  private async markNode(node: string, reason: string): Promise<number> {
    const k = this.o.keys;
    const ids = new Set<string>();
    for (const e of (await this.o.kv.list(k.byNode(node))).entries) {
      const id = k.tail(e.key, k.byNode(node), SANDBOX_ID_RE);
      if (id) ids.add(id);
    }
    for (const r of this.o.records()) if (r.node === node && LIVE.has(r.state)) ids.add(r.id);
    let marked = 0;
    await bounded([...ids], this.o.parallel ?? 16, async (id) => {
      try {
        if (await this.markOne(node, id, reason)) marked++;
      } catch (e) {
        this.o.log?.("janitor: a record was not marked (the sweep retries)", {
          node,
          id,
          error: errorMessage(e),
        });
      }
    });
    if (marked > 0) this.o.log?.("janitor: sandboxes of a gone node marked lost", { node, marked, reason });
    return marked;
  }

  /**
   * Marks sandbox `id` of node `node` lost if its record is still that node's and live, and the
   * node still absent; drops its index keys either way while the node is absent. True: this
   * call marked it.
   */
  async markOne(node: string, id: string, reason: string): Promise<boolean> {
    const k = this.o.keys;
    const absent = { key: k.node(node), target: "version" as const, op: "==" as const, value: 0 };
    const e = await this.o.kv.get(k.sandbox(id));
    const r = e ? parseRecord(SandboxLocation, e.value) : null;
    if (!e || !r || r.id !== id || r.node !== node || !LIVE.has(r.state)) {
      // No live record of this node: an index key left alone goes (while the node is absent).
      await this.o.kv.txn([absent], [{ type: "delete", key: k.byNodeEntry(node, id) }]);
      return false;
    }
    const lost: SandboxLocation = {
      ...r,
      state: "lost",
      reason,
      updated: new Date(this.now()).toISOString(),
    };
    const t = await this.o.kv.txn(
      [{ key: e.key, target: "mod", op: "==", value: e.modRevision }, absent],
      [
        { type: "put", key: e.key, value: JSON.stringify(lost) },
        { type: "delete", key: k.byNodeEntry(node, id) },
        ...(r.owner !== null ? [{ type: "delete" as const, key: k.byOwnerEntry(r.owner, id) }] : []),
      ],
    );
    if (t.succeeded) this.o.onMarked?.(lost);
    return t.succeeded;
  }

  /**
   * The sweep: live records of absent nodes are marked (the reason says the sweep found them),
   * and lost records past their keep are forgotten, and exited ones of absent nodes. Resolves
   * to what it did.
   */
  async sweep(): Promise<{ marked: number; forgotten: number }> {
    const gone = new Set<string>();
    const old: SandboxLocation[] = [];
    const keep = this.o.lostKeepMs ?? LOST_KEEP_MS;
    for (const r of this.o.records()) {
      if (LIVE.has(r.state) && !this.o.present(r.node)) gone.add(r.node);
      const ended = r.state === "lost" || (r.state === "exited" && !this.o.present(r.node));
      if (ended && this.now() - Date.parse(r.updated) > keep) old.push(r);
    }
    // Index keys of absent nodes (their records gone or already marked by another gateway).
    const k = this.o.keys;
    for (const e of (await this.o.kv.list(k.byNodeAll)).entries) {
      const node = e.key.slice(k.byNodeAll.length).split("/")[0] ?? "";
      if (NODE_ID_RE.test(node) && !this.o.present(node)) gone.add(node);
    }
    let marked = 0;
    for (const node of gone) {
      // The node's absence is checked by etcd in each transaction, not by the mirror alone.
      const reason = `node ${node} was not in the cluster at ${new Date(this.now()).toISOString()}`;
      marked += await this.markNode(node, reason).catch(() => 0);
    }
    let forgotten = 0;
    await bounded(old, this.o.parallel ?? 16, async (r) => {
      const key = this.o.keys.sandbox(r.id);
      const e = await this.o.kv.get(key).catch(() => null);
      const cur = e ? parseRecord(SandboxLocation, e.value) : null;
      if (!e || cur?.state !== r.state) return;
      const t = await this.o.kv
        .txn([{ key, target: "mod", op: "==", value: e.modRevision }], [{ type: "delete", key }])
        .catch(() => null);
      if (t?.succeeded) forgotten++;
    });
    return { marked, forgotten };
  }
}

/** Runs `fn` over `items`, at most `n` at once. */
async function bounded<T>(items: T[], n: number, fn: (x: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const x = items[next++] as T;
      await fn(x);
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
}

/** Forgets lost sandbox `id`'s record (its kill: nothing runs to stop), if it is still lost. */
export async function forgetLost(kv: Kv, keys: ClusterKeys, id: string): Promise<boolean> {
  const key = keys.sandbox(id);
  const e = await kv.get(key);
  if (!e || parseRecord(SandboxLocation, e.value)?.state !== "lost") return false;
  const t = await kv.txn([{ key, target: "mod", op: "==", value: e.modRevision }], [{ type: "delete", key }]);
  return t.succeeded;
}
