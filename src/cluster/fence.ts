/**
 * Writes fenced on the node's lease: every transaction compares `nodes/<id>`'s lease with the
 * node's own, so a node whose lease etcd has expired (cut off, or its id taken over) writes
 * nothing, however late its request arrives. Ops come in groups (one sandbox's or one
 * snapshot's keys) that never straddle two transactions; a transaction holds at most
 * TXN_MAX_OPS ops (etcd's --max-txn-ops, 128 by default): a larger write is several
 * transactions, each fenced.
 */
import type { Kv, KvLease, KvOp } from "../etcd/index.js";
import { ForkdError, errorMessage } from "../util/index.js";

export const TXN_MAX_OPS = 128;

/** `groups` packed into transactions of at most `max` ops, a group never split. */
export function chunkGroups(groups: KvOp[][], max = TXN_MAX_OPS): KvOp[][] {
  const out: KvOp[][] = [];
  let cur: KvOp[] = [];
  for (const g of groups) {
    if (g.length > max) throw new ForkdError("internal", `a group of ${g.length} ops exceeds a transaction`);
    if (cur.length + g.length > max) {
      out.push(cur);
      cur = [];
    }
    cur.push(...g);
  }
  if (cur.length > 0) out.push(cur);
  return out;
}

/** What a caller sees when its work cannot be recorded in the cluster. */
export const cutOff = (what: string, why?: string): ForkdError =>
  new ForkdError(
    "unavailable",
    `node cut off from the cluster: ${what} refused until it re-joins${why ? ` (${why})` : ""}`,
  );

export class Fence {
  constructor(
    private readonly kv: Kv,
    /** The node's own key (nodes/<id>). */
    private readonly nodeKey: string,
    /** The node's lease now (null: cut off). */
    private readonly lease: () => KvLease | null,
  ) {}

  /**
   * Writes `groups` (built for the lease in force) in fenced transactions, in order. Throws
   * `unavailable` (cutOff) when the node holds no lease, the fence fails, or etcd does not
   * answer; groups of earlier transactions are then written and later ones not.
   */
  async write(groups: (lease: string) => KvOp[][], what: string): Promise<void> {
    const lease = this.lease();
    if (!lease) throw cutOff(what);
    for (const ops of chunkGroups(groups(lease.id))) {
      let ok: boolean;
      try {
        ok = (await this.kv.txn([{ key: this.nodeKey, target: "lease", op: "==", value: lease.id }], ops))
          .succeeded;
      } catch (e) {
        throw cutOff(what, errorMessage(e));
      }
      if (!ok) throw cutOff(what, "its lease no longer holds its node key");
    }
  }
}
