/**
 * The node's membership: a lease (TTL 6 s by default: docs/cluster.md, "Nodes") and its record
 * `nodes/<id>` under it, created only where no live node holds the id. While the lease lives
 * the node is admitted (it takes new work); once it is lost (etcd says so, or the watchdog
 * heard no keepalive for a whole TTL: src/etcd/etcd-kv.ts) nothing new is admitted until the
 * node has joined again with a new lease and `joined` (its reconciliation) has run. The
 * record is rewritten when its load changes, at most once per `updateMs`.
 */
import type { Kv, KvLease } from "../etcd/index.js";
import { ForkdError, errorMessage, sleep } from "../util/index.js";
import type { Logger } from "../util/index.js";
import { cutOff } from "./fence.js";
import type { ClusterKeys } from "./keys.js";
import { NodeRecord, parseRecord } from "./records.js";

export const DEFAULT_TTL_SECONDS = 6;

/** What the node says of itself now (the membership adds its lease and times). */
export type NodeSelf = Omit<NodeRecord, "lease" | "started" | "updated">;

export interface MembershipOptions {
  kv: Kv;
  keys: ClusterKeys;
  id: string;
  ttlSeconds?: number;
  self: () => Promise<NodeSelf>;
  log: Logger;
  /**
   * Runs after each join (the first and every re-join) with the new lease, before new work is
   * admitted; a throw ends that lease and the join is tried again (at start: the start fails).
   */
  joined: (lease: KvLease) => Promise<void>;
  /** Told when the lease is lost (no new work from now on). */
  lost?: (why: string) => void;
  /** Least time between two writes of the record (ms). */
  updateMs?: number;
  /** How long a join waits for another record of its id to expire before it refuses (ms). */
  takenWaitMs?: number;
}

export class Membership {
  private current: KvLease | null = null;
  private ready = false;
  private everJoined = false;
  private rejoining = false;
  private closed = false;
  private lostWhy: string | null = null;
  private readonly started = new Date().toISOString();
  private dirty = false;
  private lastWrite = 0;
  private timer: NodeJS.Timeout | null = null;
  readonly ttlSeconds: number;

  constructor(private readonly o: MembershipOptions) {
    this.ttlSeconds = o.ttlSeconds ?? DEFAULT_TTL_SECONDS;
  }

  /** The lease in force (null: cut off, or not joined yet). */
  get lease(): KvLease | null {
    return this.current;
  }

  /** Whether the node takes new work now: joined, reconciled, its lease alive. */
  get admitted(): boolean {
    return this.ready && this.current !== null;
  }

  /** Throws `unavailable` unless admitted. */
  admit(what: string): void {
    if (!this.admitted) throw cutOff(what, this.lostWhy ?? (this.everJoined ? undefined : "not joined yet"));
  }

  /** Joins once: throws when etcd does not answer or a live node holds this id. */
  async start(): Promise<void> {
    await this.joinOnce();
    this.everJoined = true;
  }

  /** Marks the record for a rewrite (its load changed). */
  update(): void {
    if (this.closed) return;
    this.dirty = true;
    if (this.timer) return;
    const wait = Math.max(0, this.lastWrite + (this.o.updateMs ?? 500) - Date.now());
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.writeRecord();
    }, wait);
    this.timer.unref();
  }

  /** Leaves the cluster: the lease is revoked (its record and holdings vanish at once). */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    const l = this.current;
    this.current = null;
    this.ready = false;
    await l?.revoke();
  }

  private async record(lease: KvLease): Promise<string> {
    const now = new Date().toISOString();
    const r: NodeRecord = { ...(await this.o.self()), lease: lease.id, started: this.started, updated: now };
    return JSON.stringify(NodeRecord.parse(r));
  }

  private async joinOnce(): Promise<void> {
    const lease = await this.o.kv.grantLease(this.ttlSeconds);
    try {
      await this.claimId(lease);
      this.current = lease;
      this.lostWhy = null;
      lease.onLost((why) => this.onLost(lease, why));
      await this.o.joined(lease);
      if (this.current !== lease) throw new ForkdError("unavailable", "the lease was lost while joining");
      this.ready = true;
      this.lastWrite = Date.now();
    } catch (e) {
      if (this.current === lease) this.current = null;
      await lease.revoke();
      throw e;
    }
  }

  /** Puts this node's record where none is (a predecessor's is waited out: it expires in a TTL). */
  private async claimId(lease: KvLease): Promise<void> {
    const key = this.o.keys.node(this.o.id);
    const deadline = Date.now() + (this.o.takenWaitMs ?? (this.ttlSeconds + 2) * 1000);
    for (;;) {
      const value = await this.record(lease);
      const r = await this.o.kv.txn(
        [{ key, target: "version", op: "==", value: 0 }],
        [{ type: "put", key, value, lease: lease.id }],
      );
      if (r.succeeded) return;
      if (Date.now() > deadline) {
        const held = parseRecord(NodeRecord, (await this.o.kv.get(key))?.value ?? "");
        throw new ForkdError(
          "conflict",
          `node id ${this.o.id} is held by a live node (${held?.api ?? "unknown address"}, started ` +
            `${held?.started ?? "?"}): every node needs a FORKD_NODE_ID of its own`,
          { node: this.o.id },
        );
      }
      await sleep(250);
    }
  }

  private onLost(lease: KvLease, why: string): void {
    if (this.current !== lease || this.closed) return;
    this.current = null;
    this.ready = false;
    this.lostWhy = why;
    this.o.log.warn("cluster: lease lost; no new work until the node re-joins", { reason: why });
    try {
      this.o.lost?.(why);
    } catch {
      // the listener's own failure
    }
    if (this.everJoined) void this.rejoin();
  }

  private async rejoin(): Promise<void> {
    if (this.rejoining) return;
    this.rejoining = true;
    try {
      for (let delay = 250; !this.closed && !this.admitted; delay = Math.min(delay * 2, 5000)) {
        try {
          await this.joinOnce();
          this.o.log.info("cluster: re-joined", { lease: this.current?.id });
        } catch (e) {
          this.o.log.warn("cluster: re-join failed; trying again", { error: errorMessage(e), in_ms: delay });
          await sleep(delay);
        }
      }
    } finally {
      this.rejoining = false;
    }
  }

  private async writeRecord(): Promise<void> {
    const lease = this.current;
    if (!this.dirty || !lease || this.closed) return;
    this.dirty = false;
    this.lastWrite = Date.now();
    const key = this.o.keys.node(this.o.id);
    try {
      // Fenced: a lost lease's record is not made again (the next join writes a fresh one).
      await this.o.kv.txn(
        [{ key, target: "lease", op: "==", value: lease.id }],
        [{ type: "put", key, value: await this.record(lease), lease: lease.id }],
      );
    } catch (e) {
      this.dirty = true;
      this.o.log.warn("cluster: node record not updated", { error: errorMessage(e) });
    }
  }
}
