/**
 * The janitor of lost sandboxes (docs/cluster.md, "Failure model"): when a node's key goes (its
 * lease expired: the node died, or was cut off from etcd for longer than its TTL), every
 * sandboxes/<id> of that node still `running` or `paused` becomes `lost` with a reason ("node n2
 * stopped answering the cluster at <time>"), and its index keys (by-node/, by-owner/) go. Records
 * are changed MARK_BATCH to a transaction (etcd allows 128 operations in one), which holds only if
 * every record in it is still the one read (its mod revision) and the node is still absent (a
 * node back under the same id keeps its sandboxes): so any number of gateways may run it at once,
 * and each record is marked once. A batch whose compares fail (a record changed meanwhile,
 * another gateway marked it) is read again and retried; one that fails again is done a record to
 * a transaction; a node found back stops the rest.
 *
 * A periodic sweep does the same for records of nodes absent from the cluster (a gateway that
 * was down when the node went, a record written after it), drops index keys of absent nodes left
 * without a live record, and forgets `lost` records older than `lostKeepMs`, and `exited` ones
 * as old of nodes absent (a node removes its own once it removed the sandbox; an absent one
 * never will).
 */
import type { Kv, KvCompare, KvEntry, KvOp } from "../etcd/index.js";
import { errorMessage } from "../util/index.js";
import type { ClusterKeys } from "./keys.js";
import { NODE_ID_RE, SANDBOX_ID_RE } from "./keys.js";
import { SandboxLocation, parseRecord } from "./records.js";
import type { NodeRecord, SandboxState } from "./records.js";

export interface JanitorOptions {
  kv: Kv;
  keys: ClusterKeys;
  /** Whether node `id` is in the cluster now (the gateway's mirror of nodes/). */
  present: (id: string) => boolean;
  /** Every sandbox record the gateway mirrors (the sweep's candidates). */
  records: () => Iterable<SandboxLocation>;
  /**
   * The gateway's mirrored record of sandbox `id`, if any: a batch leaves out the records it
   * shows already lost (another gateway marked them: lost is final, its index keys went with it).
   */
  record?: (id: string) => SandboxLocation | undefined;
  now?: () => number;
  /** Transactions (of up to MARK_BATCH records) in flight at once (default 4). */
  parallel?: number;
  /** Lost records are forgotten this long after they were marked (default 24 h). */
  lostKeepMs?: number;
  log?: (msg: string, fields: Record<string, unknown>) => void;
  /** Told each record marked lost. */
  onMarked?: (r: SandboxLocation) => void;
}

export const LOST_KEEP_MS = 24 * 3_600_000;
/**
 * Records marked in one transaction: each is a compare, a put and up to two deletes, and the
 * batch one compare more (the node's absence); etcd refuses a transaction with more than 128
 * compares or operations in a branch (its --max-txn-ops default).
 */
export const MARK_BATCH = 42;
/** Records forgotten in one transaction (a compare and a delete each). */
export const FORGET_BATCH = 128;
/** A dead node's records are read in one list of all when it holds 1/LIST_FACTOR of them... */
const LIST_FACTOR = 16;
/** ...and they are at most this many (a list's reply is held whole). */
const LIST_MAX = 200_000;
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
    if (ids.size === 0) return 0;
    const read = await this.readAll(ids);
    let marked = 0;
    const stop = { back: false };
    // In an order of its own: gateways marking the same node at once meet on few batches.
    await bounded(shuffled(chunks([...ids], MARK_BATCH)), this.o.parallel ?? 4, async (all) => {
      if (stop.back) return;
      const batch = all.filter((id) => {
        const m = this.o.record?.(id);
        return !(m?.state === "lost" && m.node === node);
      });
      if (batch.length === 0) return;
      try {
        const n = await this.markBatch(node, batch, reason, stop, read);
        marked += n;
      } catch (e) {
        this.o.log?.("janitor: records were not marked (the sweep retries)", {
          node,
          ids: batch.length,
          error: errorMessage(e),
        });
      }
    });
    if (marked > 0) this.o.log?.("janitor: sandboxes of a gone node marked lost", { node, marked, reason });
    return marked;
  }

  /**
   * The records `ids` listed from sandboxes/ when that is the cheaper read (the node holds at
   * least 1/LIST_FACTOR of the cluster's records, and they are at most LIST_MAX: a listed record
   * costs etcd and the gateway ~20x less than a get), else null (each batch gets its own), or if
   * a list fails. One list (read in pages at one revision: src/etcd/etcd-kv.ts; it was once 32
   * lists by the id's first letter, which tied this to the ids' alphabet).
   */
  private async readAll(ids: Set<string>): Promise<Map<string, KvEntry | null> | null> {
    const k = this.o.keys;
    try {
      const total = await this.o.kv.count(k.sandboxes);
      if (total > ids.size * LIST_FACTOR || total > LIST_MAX) return null;
      const out = new Map<string, KvEntry | null>([...ids].map((id) => [id, null]));
      for (const e of (await this.o.kv.list(k.sandboxes)).entries) {
        const id = e.key.slice(k.sandboxes.length);
        if (out.has(id)) out.set(id, e);
      }
      return out;
    } catch {
      return null;
    }
  }

  /**
   * Marks the records `ids` of absent node `node` in one transaction (their index keys go
   * too), from the records `read` if given, else read now; if its compares fail, reads them
   * again and retries once, then a record to a transaction. Sets `stop.back` and stops if the
   * node is found back. Resolves to how many this call marked.
   */
  private async markBatch(
    node: string,
    ids: string[],
    reason: string,
    stop: { back: boolean },
    read: Map<string, KvEntry | null> | null,
  ): Promise<number> {
    const k = this.o.keys;
    const absent = { key: k.node(node), target: "version" as const, op: "==" as const, value: 0 };
    for (let attempt = 0; attempt < 2; attempt++) {
      const entries =
        attempt === 0 && read
          ? ids.map((id) => read.get(id) ?? null)
          : await Promise.all(ids.map((id) => this.o.kv.get(k.sandbox(id))));
      const plan = this.planMarks(node, ids, entries, reason);
      const t = await this.o.kv.txn([absent, ...plan.compares], plan.ops);
      if (t.succeeded) {
        for (const r of plan.lost) this.o.onMarked?.(r);
        return plan.lost.length;
      }
      if (await this.o.kv.get(k.node(node))) {
        stop.back = true; // the node is back under its id: it keeps its sandboxes
        return 0;
      }
    }
    let marked = 0;
    for (const id of ids) {
      if (stop.back) break;
      if (await this.markOne(node, id, reason)) marked++;
    }
    return marked;
  }

  /** What marking records `ids` (read as `entries`) does: the compares, the ops, the records. */
  private planMarks(
    node: string,
    ids: string[],
    entries: (KvEntry | null)[],
    reason: string,
  ): { compares: KvCompare[]; ops: KvOp[]; lost: SandboxLocation[] } {
    const k = this.o.keys;
    const compares: KvCompare[] = [];
    const ops: KvOp[] = [];
    const lost: SandboxLocation[] = [];
    ids.forEach((id, i) => {
      const e = entries[i];
      const r = e ? parseRecord(SandboxLocation, e.value) : null;
      // Its by-node key goes either way (one left alone without a live record of this node too).
      ops.push({ type: "delete", key: k.byNodeEntry(node, id) });
      if (!e || !r || r.id !== id || r.node !== node || !LIVE.has(r.state)) return;
      const l = this.lost(r, reason);
      compares.push({ key: e.key, target: "mod", op: "==", value: e.modRevision });
      ops.push({ type: "put", key: e.key, value: JSON.stringify(l) });
      if (r.owner !== null) ops.push({ type: "delete", key: k.byOwnerEntry(r.owner, id) });
      lost.push(l);
    });
    return { compares, ops, lost };
  }

  private lost(r: SandboxLocation, reason: string): SandboxLocation {
    return { ...r, state: "lost", reason, updated: new Date(this.now()).toISOString() };
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
    const lost = this.lost(r, reason);
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
    await bounded(chunks(old, FORGET_BATCH), this.o.parallel ?? 4, async (batch) => {
      const n = await this.forgetBatch(batch).catch(() => 0);
      forgotten += n; // (not `+= await`: that reads the sum before the wait)
    });
    return { marked, forgotten };
  }

  /**
   * Forgets the ended records `rs` (those still in the state they were found in) in one
   * transaction guarded on each one's mod revision; if it fails, a record to a transaction.
   */
  private async forgetBatch(rs: SandboxLocation[]): Promise<number> {
    const k = this.o.keys;
    const entries = await Promise.all(rs.map((r) => this.o.kv.get(k.sandbox(r.id))));
    const compares: KvCompare[] = [];
    const ops: KvOp[] = [];
    rs.forEach((r, i) => {
      const e = entries[i];
      if (!e || parseRecord(SandboxLocation, e.value)?.state !== r.state) return;
      compares.push({ key: e.key, target: "mod", op: "==", value: e.modRevision });
      ops.push({ type: "delete", key: e.key });
    });
    if (ops.length === 0) return 0;
    if ((await this.o.kv.txn(compares, ops)).succeeded) return ops.length;
    let forgotten = 0;
    for (const r of rs)
      if (await forgetIf(this.o.kv, this.o.keys, r.id, r.state).catch(() => false)) forgotten++;
    return forgotten;
  }
}

/** `items` in a random order (Fisher-Yates). */
function shuffled<T>(items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [items[i], items[j]] = [items[j] as T, items[i] as T];
  }
  return items;
}

/** `items` in runs of at most `n`. */
function chunks<T>(items: T[], n: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += n) out.push(items.slice(i, i + n));
  return out;
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
export function forgetLost(kv: Kv, keys: ClusterKeys, id: string): Promise<boolean> {
  return forgetIf(kv, keys, id, "lost");
}

/** Forgets sandbox `id`'s record if it is (still) in `state`, in one transaction. */
async function forgetIf(kv: Kv, keys: ClusterKeys, id: string, state: SandboxState): Promise<boolean> {
  const key = keys.sandbox(id);
  const e = await kv.get(key);
  if (!e || parseRecord(SandboxLocation, e.value)?.state !== state) return false;
  const t = await kv.txn([{ key, target: "mod", op: "==", value: e.modRevision }], [{ type: "delete", key }]);
  return t.succeeded;
}
