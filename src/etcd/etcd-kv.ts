/**
 * The Kv (./kv.ts) on a real etcd cluster, through npm `etcd3` (the one place that imports it).
 *
 * Every unary call has a deadline (`callMs`, default 5 s) and is retried by etcd3's policy on
 * another member, and by ours (./retry.ts) through an election (`leader changed`, `no leader`)
 * until the same deadline has passed again at most; a call that still fails is a ForkdError
 * `unavailable` naming etcd, so a front door answers 503 instead of hanging. Leases are kept
 * alive by etcd3 (a keepalive every third of the TTL); on top of its own `lost` event, a
 * watchdog declares a lease lost once no keepalive has succeeded for the whole TTL: a holder
 * cut off from etcd learns it no later than etcd expires its keys (./kv.ts, KvLease).
 */
import { readFileSync } from "node:fs";
import { Etcd3, Range } from "etcd3";
import type { IKeyValue, Lease, Watcher } from "etcd3";
import { ForkdError, errorMessage } from "../util/index.js";
import type { EtcdEndpoints } from "./endpoints.js";
import type { Kv, KvCompare, KvEntry, KvLease, KvOp, KvTxnResult, KvWatch, KvWatchEvent } from "./kv.js";
import { withRetries } from "./retry.js";

export interface EtcdKvOptions {
  /** Deadline of one unary call, retries included. */
  callMs?: number;
  /** PEM files for an `etcds://` cluster (FORKD_CLUSTER_CA, _CERT, _KEY). */
  tls?: { ca?: string; cert?: string; key?: string };
}

/** Keys one round trip of a list reads (a record is at most 64 KiB: src/cluster/records.ts). */
const LIST_PAGE = 500;
/** What one reply may carry: a page of the largest records (gRPC's default is 4 MiB). */
const MAX_RECEIVE_BYTES = 64 << 20;

const COLUMN = { version: "Version", create: "Create", mod: "Mod", value: "Value", lease: "Lease" } as const;

function entryOf(kv: IKeyValue): KvEntry {
  return {
    key: kv.key.toString("utf8"),
    value: kv.value.toString("utf8"),
    createRevision: Number(kv.create_revision),
    modRevision: Number(kv.mod_revision),
    version: Number(kv.version),
    lease: String(kv.lease),
  };
}

const unavailable = (what: string, e: unknown): ForkdError =>
  e instanceof ForkdError ? e : new ForkdError("unavailable", `etcd: ${what}: ${errorMessage(e)}`, {}, e);

export class EtcdKv implements Kv {
  private readonly client: Etcd3;
  private readonly callMs: number;
  /** Leases granted and kept alive by this client: close() stops keeping them. */
  private readonly leases = new Set<KeptLease>();

  constructor(endpoints: EtcdEndpoints, opts: EtcdKvOptions = {}) {
    this.callMs = opts.callMs ?? 5000;
    const scheme = endpoints.tls ? "https://" : "http://";
    const read = (p: string | undefined) => (p ? readFileSync(p) : undefined);
    this.client = new Etcd3({
      hosts: endpoints.hosts.map((h) => scheme + h),
      dialTimeout: Math.min(this.callMs, 3000),
      grpcOptions: { "grpc.max_receive_message_length": MAX_RECEIVE_BYTES },
      defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + this.callMs }),
      ...(endpoints.tls
        ? {
            credentials: {
              rootCertificate: read(opts.tls?.ca) ?? Buffer.alloc(0),
              ...(opts.tls?.cert ? { certChain: read(opts.tls.cert) } : {}),
              ...(opts.tls?.key ? { privateKey: read(opts.tls.key) } : {}),
            },
          }
        : {}),
    });
  }

  async get(key: string): Promise<KvEntry | null> {
    try {
      const r = await withRetries("idempotent", this.callMs, () => this.client.get(key).exec());
      const kv = r.kvs[0];
      return kv ? entryOf(kv) : null;
    } catch (e) {
      throw unavailable(`get ${key}`, e);
    }
  }

  /**
   * Read in pages of LIST_PAGE keys, every page at the first one's revision (one consistent
   * view, however many pages): one reply of a whole prefix outgrew gRPC's receive bound (31,000
   * sandbox records refused: bench/janitor-dead-node.ts).
   */
  async list(prefix: string, limit?: number): Promise<{ entries: KvEntry[]; revision: number }> {
    try {
      const entries: KvEntry[] = [];
      const { end } = Range.prefix(prefix);
      let start = Buffer.from(prefix);
      let revision = 0;
      for (;;) {
        const page = limit === undefined ? LIST_PAGE : Math.min(LIST_PAGE, limit - entries.length);
        const r = await withRetries("idempotent", this.callMs, () => {
          const b = this.client.getAll().inRange({ start, end }).sort("Key", "Ascend").limit(page);
          return (revision > 0 ? b.revision(revision) : b).exec();
        });
        if (revision === 0) revision = Number(r.header.revision);
        entries.push(...r.kvs.map(entryOf));
        const last = r.kvs[r.kvs.length - 1];
        if (!r.more || !last || (limit !== undefined && entries.length >= limit)) break;
        start = Buffer.concat([last.key, Buffer.from([0])]);
      }
      return { entries, revision };
    } catch (e) {
      throw unavailable(`list ${prefix}`, e);
    }
  }

  async count(prefix: string): Promise<number> {
    try {
      return await withRetries("idempotent", this.callMs, () => this.client.getAll().prefix(prefix).count());
    } catch (e) {
      throw unavailable(`count ${prefix}`, e);
    }
  }

  async put(key: string, value: string, lease?: string): Promise<number> {
    try {
      const r = await withRetries("idempotent", this.callMs, () => {
        const b = this.client.put(key).value(value);
        return (lease !== undefined ? b.lease(lease) : b).exec();
      });
      return Number(r.header.revision);
    } catch (e) {
      throw unavailable(`put ${key}`, e);
    }
  }

  async delete(key: string): Promise<void> {
    try {
      await withRetries("idempotent", this.callMs, () => this.client.delete().key(key).exec());
    } catch (e) {
      throw unavailable(`delete ${key}`, e);
    }
  }

  async txn(compares: KvCompare[], then: KvOp[], otherwise: KvOp[] = []): Promise<KvTxnResult> {
    // A transaction with no condition: a compare that always holds (no key has a version < 0).
    const all: KvCompare[] = compares.length
      ? compares
      : [{ key: "\u0000", target: "version", op: ">", value: -1 }];
    try {
      const [first, ...rest] = all as [KvCompare, ...KvCompare[]];
      const r = await withRetries("txn", this.callMs, () => {
        let b = this.client.if(first.key, COLUMN[first.target], first.op, first.value);
        for (const c of rest) b = b.and(c.key, COLUMN[c.target], c.op, c.value);
        return b
          .then(...then.map((o) => this.op(o)))
          .else(...otherwise.map((o) => this.op(o)))
          .commit();
      });
      return { succeeded: r.succeeded, revision: Number(r.header.revision) };
    } catch (e) {
      throw unavailable(`txn on ${all[0]?.key ?? "?"}`, e);
    }
  }

  private op(o: KvOp) {
    if (o.type === "put") {
      const b = this.client.put(o.key).value(o.value);
      return o.lease !== undefined ? b.lease(o.lease) : b;
    }
    return o.prefix ? this.client.delete().prefix(o.key) : this.client.delete().key(o.key);
  }

  async watch(
    prefix: string,
    fromRevision: number,
    onEvent: (e: KvWatchEvent) => void,
    onError: (e: Error) => void,
  ): Promise<KvWatch> {
    let w: Watcher;
    try {
      w = await withDeadline(
        this.client.watch().prefix(prefix).startRevision(String(fromRevision)).create(),
        this.callMs,
        `watch ${prefix}`,
      );
    } catch (e) {
      throw unavailable(`watch ${prefix}`, e);
    }
    let failed = false;
    const fail = (e: Error) => {
      if (failed) return;
      failed = true;
      void w.cancel().catch(() => undefined);
      onError(e);
    };
    w.on("put", (kv) => {
      if (!failed) onEvent({ type: "put", ...pick(kv) });
    });
    w.on("delete", (kv) => {
      if (!failed) onEvent({ type: "delete", ...pick(kv), value: "" });
    });
    w.on("error", (e) => fail(e));
    return {
      close: async () => {
        failed = true;
        await w.cancel().catch(() => undefined);
      },
    };
  }

  async grantLease(ttlSeconds: number): Promise<KvLease> {
    const lease = this.client.lease(ttlSeconds, { autoKeepAlive: true });
    let id: string;
    try {
      id = await lease.grant();
    } catch (e) {
      lease.release();
      throw unavailable("lease grant", e);
    }
    const kept = new KeptLease(lease, id, ttlSeconds, () => this.leases.delete(kept));
    this.leases.add(kept);
    return kept;
  }

  /**
   * Closes the client. Its leases are no longer kept alive (etcd3's own close() leaves their
   * keepalives running) nor revoked: etcd expires them after their TTL, as a dead process's.
   */
  async close(): Promise<void> {
    for (const l of [...this.leases]) l.release();
    this.client.close();
  }
}

function pick(kv: IKeyValue): { key: string; value: string; modRevision: number } {
  return {
    key: kv.key.toString("utf8"),
    value: kv.value.toString("utf8"),
    modRevision: Number(kv.mod_revision),
  };
}

async function withDeadline<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        t = setTimeout(
          () => reject(new ForkdError("unavailable", `etcd: ${what}: no answer in ${ms} ms`)),
          ms,
        );
      }),
    ]);
  } finally {
    clearTimeout(t);
  }
}

/** A lease etcd3 keeps alive, with the watchdog described in the header. */
class KeptLease implements KvLease {
  private last = Date.now();
  private lost: string | null = null;
  private readonly handlers: ((why: string) => void)[] = [];
  private readonly watchdog: NodeJS.Timeout;

  constructor(
    private readonly lease: Lease,
    readonly id: string,
    readonly ttlSeconds: number,
    private readonly forget: () => void,
  ) {
    lease.on("keepaliveSucceeded", () => {
      this.last = Date.now();
    });
    lease.on("lost", (e) => this.markLost(`etcd lost the lease: ${errorMessage(e)}`));
    this.watchdog = setInterval(() => {
      if (this.sinceKeepalive() > ttlSeconds * 1000) {
        this.markLost(`no keepalive answered for ${ttlSeconds} s`);
      }
    }, 250);
    this.watchdog.unref();
  }

  sinceKeepalive(): number {
    return Date.now() - this.last;
  }

  onLost(fn: (why: string) => void): void {
    if (this.lost !== null) queueMicrotask(() => fn(this.lost ?? ""));
    else this.handlers.push(fn);
  }

  /** Stops keeping the lease alive without revoking it, and without telling it lost (a close). */
  release(): void {
    clearInterval(this.watchdog);
    this.lost ??= "released";
    this.lease.release();
    this.forget();
  }

  private markLost(why: string): void {
    if (this.lost !== null) return;
    this.lost = why;
    clearInterval(this.watchdog);
    this.forget();
    this.lease.release();
    for (const h of this.handlers.splice(0)) {
      try {
        h(why);
      } catch {
        // a handler's failure is its own; the others still run
      }
    }
  }

  async revoke(): Promise<void> {
    clearInterval(this.watchdog);
    this.forget();
    const done = this.lost === null;
    this.lost ??= "revoked";
    if (!done) return;
    await withDeadline(this.lease.revoke(), 3000, "lease revoke").catch(() => this.lease.release());
  }
}
