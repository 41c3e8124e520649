/**
 * Where this node's sandboxes run: `sandboxes/<id>` (SandboxLocation) with the index keys
 * `by-node/<node>/<id>` and `by-owner/<tenant>/<id>` while it is running or paused, every write
 * fenced on the node's lease (fence.ts).
 *   - a fork's children: recorded in one transaction per fan-out (chunked at etcd's 128 ops)
 *     before the fork answers; a failure fails the fork (src/sandbox/fork.ts kills them);
 *   - a state change (paused, resumed, exited with its reason): written as it happens, from the
 *     registry's events (a burst batched); an exited sandbox's index keys removed; a sandbox the
 *     node forgot (killed, or exited and forgotten) removed with them;
 *   - reconcile (at start and after each re-join): every live sandbox written as it is here,
 *     with node = this one (a `lost` others wrote meanwhile becomes running again: it survived),
 *     and every record naming this node that it no longer has made `exited`, with the reason.
 * Ids are keys: a sandbox is never written twice.
 */
import type { KvOp } from "../etcd/index.js";
import type { ReadonlySandbox } from "../sandbox/index.js";
import { SANDBOX_ID_RE, errorMessage } from "../util/index.js";
import type { NodeContext } from "./context.js";
import { DirtySet } from "./dirty-set.js";
import { SandboxLocation, parseRecord } from "./records.js";

/** The reason a record naming this node says when the node no longer has its sandbox. */
export const goneWhileAway = (node: string): string =>
  `not on node ${node} when it re-joined the cluster: it ended while the node was down or cut off`;

export class Locations {
  /** Sandboxes whose location this node wrote: their owner and the state written. */
  private readonly recorded = new Map<string, { owner: string | null; state: string }>();
  private readonly dirty: DirtySet;

  constructor(private readonly c: NodeContext) {
    this.dirty = new DirtySet({
      delayMs: 50,
      flush: (ids) => this.flush(ids),
      onError: (e, n) =>
        c.log.warn("cluster: sandbox locations not written; trying again", {
          sandboxes: n,
          error: errorMessage(e),
        }),
    });
  }

  /** Records a fan-out's children (fenced, one transaction per 128 ops); throws when it cannot. */
  async recordForked(children: readonly ReadonlySandbox[]): Promise<void> {
    const now = new Date().toISOString();
    const states = children.map((sb) => ({ sb, state: sb.state }));
    // Known before the write: a child killed once it failed is then removed again (flush).
    for (const { sb, state } of states)
      this.recorded.set(sb.record.id, { owner: sb.record.owner ?? null, state });
    await this.c.fence.write(
      () => states.map(({ sb }) => this.opsOf(sb, now)),
      `a fork of ${children.length} (its children are not recorded)`,
    );
    // Changed while being written: written again.
    for (const { sb, state } of states) if (sb.state !== state) this.dirty.mark(sb.record.id);
  }

  /** A sandbox was created or changed state. */
  changed(sb: ReadonlySandbox): void {
    const r = this.recorded.get(sb.record.id);
    if (r && r.state !== sb.state) this.dirty.mark(sb.record.id);
  }

  /** A sandbox is no longer listed here. */
  gone(id: string): void {
    if (this.recorded.has(id)) this.dirty.mark(id);
  }

  async flushNow(): Promise<void> {
    await this.dirty.flushNow();
  }

  close(): void {
    this.dirty.close();
  }

  /**
   * Writes every live sandbox as it is here, and marks every record naming this node that it
   * no longer has `exited` (their index keys removed). Fenced; throws when it cannot.
   */
  async reconcile(): Promise<void> {
    const { keys, id } = this.c;
    const [byNode, all] = await Promise.all([
      this.c.kv.list(keys.byNode(id)),
      this.c.kv.list(keys.sandboxes),
    ]);
    const local = new Map(this.c.sandboxes.list().map((sb) => [sb.record.id, sb]));
    const now = new Date().toISOString();
    const named = new Map<string, SandboxLocation | null>();
    for (const e of all.entries) {
      const l = parseRecord(SandboxLocation, e.value);
      if (l?.node === id) named.set(l.id, l);
    }
    for (const e of byNode.entries) {
      const sid = keys.tail(e.key, keys.byNode(id), SANDBOX_ID_RE);
      if (sid !== null && !named.has(sid)) named.set(sid, null);
    }
    const groups: KvOp[][] = [...local.values()].map((sb) => this.opsOf(sb, now));
    for (const [sid, l] of named) {
      if (local.has(sid)) continue;
      const ops: KvOp[] = [{ type: "delete", key: keys.byNodeEntry(id, sid) }];
      if (l?.owner) ops.push({ type: "delete", key: keys.byOwnerEntry(l.owner, sid) });
      if (l && l.state !== "exited")
        ops.push({
          type: "put",
          key: keys.sandbox(sid),
          value: JSON.stringify({ ...l, state: "exited", reason: goneWhileAway(id), updated: now }),
        });
      groups.push(ops);
    }
    await this.c.fence.write(() => groups, "reconciling its sandboxes");
    this.recorded.clear();
    for (const sb of local.values())
      this.recorded.set(sb.record.id, { owner: sb.record.owner ?? null, state: sb.state });
    this.c.log.info("cluster: sandboxes reconciled", {
      live: local.size,
      gone: [...named.keys()].filter((sid) => !local.has(sid)).length,
    });
  }

  private async flush(ids: string[]): Promise<void> {
    const live = new Map(this.c.sandboxes.list().map((sb) => [sb.record.id, sb]));
    const now = new Date().toISOString();
    const writes: { id: string; state: string | null; ops: KvOp[] }[] = [];
    for (const id of ids) {
      const r = this.recorded.get(id);
      if (!r) continue;
      const sb = live.get(id);
      if (sb) {
        if (sb.state !== r.state) writes.push({ id, state: sb.state, ops: this.opsOf(sb, now) });
        continue;
      }
      const ops: KvOp[] = [
        { type: "delete", key: this.c.keys.sandbox(id) },
        { type: "delete", key: this.c.keys.byNodeEntry(this.c.id, id) },
      ];
      if (r.owner !== null) ops.push({ type: "delete", key: this.c.keys.byOwnerEntry(r.owner, id) });
      writes.push({ id, state: null, ops });
    }
    if (writes.length === 0) return;
    await this.c.fence.write(() => writes.map((w) => w.ops), "sandbox state changes");
    for (const w of writes) {
      const r = this.recorded.get(w.id);
      if (w.state === null) this.recorded.delete(w.id);
      else if (r) r.state = w.state;
    }
  }

  /** The keys of `sb` as it is now. */
  private opsOf(sb: ReadonlySandbox, now: string): KvOp[] {
    const { keys, id } = this.c;
    const sid = sb.record.id;
    const owner = sb.record.owner ?? null;
    const loc: SandboxLocation = {
      id: sid,
      node: id,
      owner,
      tag: sb.record.tag,
      state: sb.state,
      reason: sb.state === "exited" ? (sb.exitReason ?? "exited") : null,
      created: sb.record.created,
      updated: now,
    };
    const live = sb.state !== "exited";
    const index = (key: string): KvOp => (live ? { type: "put", key, value: "" } : { type: "delete", key });
    return [
      { type: "put", key: keys.sandbox(sid), value: JSON.stringify(loc) },
      index(keys.byNodeEntry(id, sid)),
      ...(owner !== null ? [index(keys.byOwnerEntry(owner, sid))] : []),
    ];
  }
}
