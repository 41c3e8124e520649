/**
 * `holdings/<node>/<key>`: every ready snapshot this node has, under the digest it holds it by
 * (held-digests.ts) and with its warmth (ready members of its warm pool), under the node's
 * lease, kept current from the store's and the pool's events (node.ts marks a key, a flush
 * writes what is true now). Written again whole after each join (the old lease took them).
 */
import type { KvOp } from "../etcd/index.js";
import { errorMessage } from "../util/index.js";
import type { NodeContext } from "./context.js";
import { DirtySet } from "./dirty-set.js";
import type { Holding } from "./records.js";

export class Holdings {
  /** What this node last wrote for each key (skipped when unchanged). */
  private readonly written = new Map<string, string>();
  private readonly dirty: DirtySet;

  constructor(private readonly c: NodeContext) {
    this.dirty = new DirtySet({
      delayMs: 100,
      flush: (keys) => this.flush(keys),
      onError: (e, n) =>
        c.log.warn("cluster: holdings not written; trying again", { keys: n, error: errorMessage(e) }),
    });
  }

  mark(key: string): void {
    this.dirty.mark(key);
  }

  /** After a join: every holding written again under the new lease (the old one took them). */
  async rejoined(): Promise<void> {
    this.written.clear();
    for (const m of await this.c.store.list()) this.dirty.mark(m.tag);
    await this.dirty.flushNow();
  }

  async flushNow(): Promise<void> {
    await this.dirty.flushNow();
  }

  close(): void {
    this.dirty.close();
  }

  private async flush(keys: string[]): Promise<void> {
    const warm = this.c.sandboxes.poolStatus();
    const want = new Map<string, string | null>();
    for (const key of keys) {
      const digest = this.c.held.get(key);
      const here = digest !== undefined && (await this.c.store.has(key));
      const h: Holding | null = here ? { key, digest, warm: warm[key] ?? 0 } : null;
      const value = h ? JSON.stringify(h) : null;
      if (value === (this.written.get(key) ?? null)) continue;
      want.set(key, value);
    }
    if (want.size === 0) return;
    await this.c.fence.write(
      (lease) =>
        [...want].map(([key, value]): KvOp[] =>
          value === null
            ? [{ type: "delete", key: this.c.keys.holding(this.c.id, key) }]
            : [{ type: "put", key: this.c.keys.holding(this.c.id, key), value, lease }],
        ),
      "holdings",
    );
    for (const [key, value] of want) {
      if (value === null) this.written.delete(key);
      else this.written.set(key, value);
    }
  }
}
