/**
 * Copies to remove: a snapshot this node holds whose catalog entry went (deleted through the
 * API on any node), or was replaced by another snapshot of the same tag. Each is removed once no
 * sandbox here runs from it, deepest first (a branch before what it stacks on); a branch of it
 * that stays in the catalog is flattened first (src/snapshot/chain.ts, force). Tried again on
 * every sandbox's end and every few seconds while any is left.
 */
import { errorMessage } from "../util/index.js";
import type { NodeContext } from "./context.js";

const RETRY_MS = 5_000;

export class Removals {
  private readonly pending = new Set<string>();
  private running: Promise<void> | null = null;
  private again = false;
  private timer: NodeJS.Timeout | null = null;
  private closed = false;

  constructor(private readonly c: NodeContext) {}

  get size(): number {
    return this.pending.size;
  }

  /** Whether this node's copy of `key` is stale: the catalog lacks it, or has another snapshot. */
  stale(key: string): boolean {
    const held = this.c.held.get(key);
    const e = this.c.catalog.get(this.c.keys.catalogEntry(key));
    return held !== undefined && e?.digest !== held;
  }

  add(key: string): void {
    if (this.closed) return;
    this.pending.add(key);
    this.poke();
  }

  /** Tries the pending removals now (after a run in progress). */
  poke(): void {
    if (this.pending.size === 0 || this.closed) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.run().finally(() => {
      this.running = null;
      if (this.again) {
        this.again = false;
        this.poke();
      } else if (this.pending.size > 0 && !this.timer && !this.closed) {
        this.timer = setTimeout(() => {
          this.timer = null;
          this.poke();
        }, RETRY_MS);
        this.timer.unref();
      }
    });
  }

  async settled(): Promise<void> {
    while (this.running) await this.running;
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
  }

  private async run(): Promise<void> {
    const metas = await this.c.store.list().catch(() => []);
    const parent = new Map(metas.map((m) => [m.tag, m.parent?.tag ?? null]));
    const depth = (t: string): number => {
      let d = 0;
      for (let p = parent.get(t); p && d < 1000; p = parent.get(p)) d++;
      return d;
    };
    const order = [...this.pending].sort((a, b) => depth(b) - depth(a));
    for (const key of order) {
      if (this.closed) return;
      if (!parent.has(key) || !this.stale(key)) {
        // Gone already, or back in the catalog as the very snapshot held here.
        if (!(await this.c.store.has(key)) || !this.stale(key)) this.pending.delete(key);
        continue;
      }
      if (this.c.sandboxes.countByTag(key) > 0) continue;
      if (metas.some((m) => m.parent?.tag === key && this.pending.has(m.tag))) continue;
      try {
        await this.c.snapshots.deleteCopy(key);
        this.pending.delete(key);
        this.c.log.info("cluster: copy removed (deleted from the cluster)", { tag: key });
      } catch (e) {
        // Busy (being deleted here right now, through the API): tried again.
        this.c.log.info("cluster: copy not removed yet", { tag: key, error: errorMessage(e) });
      }
    }
  }
}
