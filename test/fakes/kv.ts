/**
 * An in-memory Kv (src/etcd/kv.ts) for unit tests: etcd's model (one revision counter, keys
 * with create/mod revisions and versions, leases, transactions, watches replayed from a
 * revision) in one process. It passes the same contract suite as a real etcd
 * (test/contract/kv.ts), and refuses a transaction etcd would (more than `maxTxnOps` compares or
 * operations in a branch: etcd's --max-txn-ops, 128 by default). `expireLease` and `cut` stand in for time and the network.
 */
import type {
  Kv,
  KvCompare,
  KvEntry,
  KvLease,
  KvOp,
  KvTxnResult,
  KvWatch,
  KvWatchEvent,
} from "../../src/etcd/kv.js";
import { ForkdError } from "../../src/util/errors.js";

interface Watcher {
  prefix: string;
  onEvent: (e: KvWatchEvent) => void;
  closed: boolean;
}

export class FakeKv implements Kv {
  private rev = 1;
  private readonly data = new Map<string, KvEntry>();
  private readonly history: KvWatchEvent[] = [];
  private readonly watchers = new Set<Watcher>();
  private readonly leases = new Map<string, FakeLease>();
  private nextLease = 0x1000;
  /** While true, every call fails as an unreachable etcd does. */
  cut = false;
  /** The most compares, or operations in one branch, a transaction may hold (etcd's default). */
  maxTxnOps = 128;
  /** Transactions run (applied or not), for tests that count them. */
  txns = 0;

  private check(): void {
    if (this.cut) throw new ForkdError("unavailable", "etcd: unreachable (fake cut)");
  }

  get revision(): number {
    return this.rev;
  }

  async get(key: string): Promise<KvEntry | null> {
    this.check();
    const e = this.data.get(key);
    return e ? { ...e } : null;
  }

  async list(prefix: string, limit?: number): Promise<{ entries: KvEntry[]; revision: number }> {
    this.check();
    const entries = [...this.data.values()]
      .filter((e) => e.key.startsWith(prefix))
      .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0))
      .slice(0, limit ?? Infinity)
      .map((e) => ({ ...e }));
    return { entries, revision: this.rev };
  }

  async count(prefix: string): Promise<number> {
    return (await this.list(prefix)).entries.length;
  }

  async put(key: string, value: string, lease?: string): Promise<number> {
    this.check();
    this.rev++;
    this.apply({ type: "put", key, value, ...(lease !== undefined ? { lease } : {}) });
    return this.rev;
  }

  async delete(key: string): Promise<void> {
    this.check();
    if (!this.data.has(key)) return;
    this.rev++;
    this.apply({ type: "delete", key });
  }

  private holds(c: KvCompare): boolean {
    const e = this.data.get(c.key);
    const actual: number | string =
      c.target === "version"
        ? (e?.version ?? 0)
        : c.target === "create"
          ? (e?.createRevision ?? 0)
          : c.target === "mod"
            ? (e?.modRevision ?? 0)
            : c.target === "lease"
              ? (e?.lease ?? "0")
              : (e?.value ?? "");
    const want = typeof actual === "number" ? Number(c.value) : String(c.value);
    switch (c.op) {
      case "==":
        return actual === want;
      case "!=":
        return actual !== want;
      case ">":
        return actual > want;
      case "<":
        return actual < want;
    }
  }

  async txn(compares: KvCompare[], then: KvOp[], otherwise: KvOp[] = []): Promise<KvTxnResult> {
    this.check();
    if (Math.max(compares.length, then.length, otherwise.length) > this.maxTxnOps)
      throw new ForkdError(
        "unavailable",
        `etcd: txn on ${compares[0]?.key ?? "?"}: etcdserver: too many operations in txn request`,
      );
    this.txns++;
    const ok = compares.every((c) => this.holds(c));
    const ops = ok ? then : otherwise;
    const changes = ops.some((o) => o.type === "put" || this.matching(o).length > 0);
    if (changes) this.rev++;
    for (const o of ops) this.apply(o);
    return { succeeded: ok, revision: this.rev };
  }

  private matching(o: Extract<KvOp, { type: "delete" }>): string[] {
    return o.prefix
      ? [...this.data.keys()].filter((k) => k.startsWith(o.key))
      : this.data.has(o.key)
        ? [o.key]
        : [];
  }

  /** Applies one op at the current revision (the caller bumped it). */
  private apply(o: KvOp): void {
    if (o.type === "put") {
      if (o.lease !== undefined && o.lease !== "0" && !this.leases.has(o.lease))
        throw new ForkdError("unavailable", `etcd: requested lease not found`);
      const old = this.data.get(o.key);
      const e: KvEntry = {
        key: o.key,
        value: o.value,
        createRevision: old?.createRevision ?? this.rev,
        modRevision: this.rev,
        version: (old?.version ?? 0) + 1,
        lease: o.lease ?? "0",
      };
      this.data.set(o.key, e);
      this.emit({ type: "put", key: o.key, value: o.value, modRevision: this.rev });
      return;
    }
    for (const k of this.matching(o)) {
      this.data.delete(k);
      this.emit({ type: "delete", key: k, value: "", modRevision: this.rev });
    }
  }

  private emit(e: KvWatchEvent): void {
    this.history.push(e);
    for (const w of this.watchers) {
      if (!w.closed && e.key.startsWith(w.prefix)) queueMicrotask(() => !w.closed && w.onEvent(e));
    }
  }

  async watch(
    prefix: string,
    fromRevision: number,
    onEvent: (e: KvWatchEvent) => void,
    _onError: (e: Error) => void,
  ): Promise<KvWatch> {
    this.check();
    const w: Watcher = { prefix, onEvent, closed: false };
    for (const e of this.history) {
      if (e.modRevision >= fromRevision && e.key.startsWith(prefix))
        queueMicrotask(() => !w.closed && onEvent(e));
    }
    this.watchers.add(w);
    return {
      close: async () => {
        w.closed = true;
        this.watchers.delete(w);
      },
    };
  }

  /** The prefixes watched now (one entry per open watch). */
  watching(): string[] {
    return [...this.watchers].filter((w) => !w.closed).map((w) => w.prefix);
  }

  async grantLease(ttlSeconds: number): Promise<KvLease> {
    this.check();
    const id = (this.nextLease++).toString(16);
    const l = new FakeLease(id, ttlSeconds, () => this.expireLease(id));
    this.leases.set(id, l);
    return l;
  }

  /** Ends a lease as etcd does when it expires: its keys are deleted, its holder told. */
  expireLease(id: string): void {
    const l = this.leases.get(id);
    if (!l) return;
    this.leases.delete(id);
    const keys = [...this.data.values()].filter((e) => e.lease === id).map((e) => e.key);
    if (keys.length) {
      this.rev++;
      for (const k of keys) this.apply({ type: "delete", key: k });
    }
    l.lose("lease expired");
  }

  async close(): Promise<void> {
    for (const w of this.watchers) w.closed = true;
    this.watchers.clear();
  }
}

class FakeLease implements KvLease {
  private lost: string | null = null;
  private readonly handlers: ((why: string) => void)[] = [];
  private readonly granted = Date.now();

  constructor(
    readonly id: string,
    readonly ttlSeconds: number,
    private readonly end: () => void,
  ) {}

  sinceKeepalive(): number {
    return this.lost === null ? 0 : Date.now() - this.granted;
  }

  onLost(fn: (why: string) => void): void {
    if (this.lost !== null) queueMicrotask(() => fn(this.lost ?? ""));
    else this.handlers.push(fn);
  }

  lose(why: string): void {
    if (this.lost !== null) return;
    this.lost = why;
    for (const h of this.handlers.splice(0)) h(why);
  }

  async revoke(): Promise<void> {
    if (this.lost !== null) return;
    this.lost = "revoked"; // a revoke is the holder's own doing: not told as a loss
    this.end();
  }
}
