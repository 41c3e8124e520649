/**
 * envd's polling watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher): a watch whose
 * events wait in a bounded buffer until polled. Bounded in number (per sandbox, per tenant and
 * in all), its events in number and bytes per watcher and in bytes per tenant and over all
 * watchers (past a bound the oldest of the pushing watcher are dropped, and the next poll says
 * how many were lost before it returns the rest), and one not polled for IDLE_MS is removed (its
 * watch stopped, its sandbox lease released). The tenant is the sandbox's owner (an admin's
 * sandboxes count as one more tenant): one tenant's watchers can never take the whole daemon's
 * budget, so the others can always create theirs.
 */
import { randomUUID } from "node:crypto";
import type { WatchHandle } from "../../agent/index.js";
import { ForkdError } from "../../util/index.js";
import type { FilesystemEvent } from "./gen/filesystem/filesystem_pb.js";

/** Events kept per watcher between polls; past it the oldest are dropped. */
export const MAX_BUFFERED = 10_000;
/** Bytes of events kept per watcher, and over all watchers (an event's size is estimated). */
export const MAX_BUFFERED_BYTES = 2 << 20;
export const MAX_TOTAL_BYTES = 64 << 20;
export const MAX_PER_SANDBOX = 64;
/** Watchers, and bytes of events, of one tenant's sandboxes at once. */
export const MAX_PER_TENANT = 128;
export const MAX_TENANT_BYTES = 16 << 20;
/** Watchers over all tenants. */
export const MAX_WATCHERS = 1024;
/** A watcher nobody polled for this long is removed. */
export const IDLE_MS = 5 * 60_000;

/** The budgets (tests make them small). */
export interface WatcherBounds {
  perSandbox: number;
  perTenant: number;
  total: number;
  tenantBytes: number;
  totalBytes: number;
}

const BOUNDS: WatcherBounds = {
  perSandbox: MAX_PER_SANDBOX,
  perTenant: MAX_PER_TENANT,
  total: MAX_WATCHERS,
  tenantBytes: MAX_TENANT_BYTES,
  totalBytes: MAX_TOTAL_BYTES,
};

/** A tenant's key in the budgets: its name, or "" for an admin's sandboxes. */
const tenantKey = (owner: string | null): string => owner ?? "";

interface Watcher {
  sandboxId: string;
  tenant: string;
  handle: WatchHandle | null;
  release: () => void;
  events: FilesystemEvent[];
  /** The estimated size of each of `events`, and their sum. */
  sizes: number[];
  bytes: number;
  /** Events dropped since the last poll. */
  lost: number;
  polledAt: number;
  /** Why its watch ended (the directory went away, the sandbox ended), once it has. */
  error: unknown;
}

/** What an event holds, roughly: its name and its entry's strings, and a fixed overhead. */
export function eventBytes(e: FilesystemEvent): number {
  const en = e.entry;
  const entry = en
    ? 128 +
      en.name.length +
      en.path.length +
      en.owner.length +
      en.group.length +
      (en.symlinkTarget?.length ?? 0)
    : 0;
  return 64 + e.name.length + entry;
}

export class Watchers {
  private readonly byId = new Map<string, Watcher>();

  /** Bytes of events buffered over all watchers. */
  private total = 0;
  /** Watchers and bytes of events buffered per tenant (tenantKey). */
  private readonly tenants = new Map<string, { watchers: number; bytes: number }>();

  private readonly sweep: NodeJS.Timeout;
  private readonly bounds: WatcherBounds;

  constructor(
    private readonly idleMs = IDLE_MS,
    bounds: Partial<WatcherBounds> = {},
  ) {
    this.bounds = { ...BOUNDS, ...bounds };
    this.sweep = setInterval(() => this.expire(), Math.min(idleMs, 60_000));
    this.sweep.unref();
  }

  private tenant(key: string): { watchers: number; bytes: number } {
    let t = this.tenants.get(key);
    if (!t) this.tenants.set(key, (t = { watchers: 0, bytes: 0 }));
    return t;
  }

  /**
   * Reserves a watcher for `sandboxId`, a sandbox of `owner` (null: an admin's); `release` is
   * called when it is removed. Refused (resource_exhausted, saying which budget) past the
   * sandbox's, the tenant's or the daemon's.
   */
  reserve(
    sandboxId: string,
    owner: string | null,
    release: () => void,
  ): { id: string; push: (e: FilesystemEvent) => void } {
    this.expire();
    const b = this.bounds;
    const mine = [...this.byId.values()].filter((w) => w.sandboxId === sandboxId).length;
    if (mine >= b.perSandbox)
      throw new ForkdError("resource_exhausted", `too many watchers: at most ${b.perSandbox} per sandbox`, {
        budget: "sandbox",
        limit: b.perSandbox,
      });
    const key = tenantKey(owner);
    const t = this.tenant(key);
    if (t.watchers >= b.perTenant)
      throw new ForkdError(
        "resource_exhausted",
        `too many watchers: this tenant's sandboxes have ${t.watchers}, at most ${b.perTenant}; remove some (RemoveWatcher) first`,
        { budget: "tenant", limit: b.perTenant },
      );
    if (this.byId.size >= b.total)
      throw new ForkdError(
        "resource_exhausted",
        `too many watchers on this host (${b.total}); try again later`,
        {
          budget: "daemon",
          limit: b.total,
        },
      );
    t.watchers++;
    const id = randomUUID();
    const w: Watcher = {
      tenant: key,
      sandboxId,
      handle: null,
      release,
      events: [],
      sizes: [],
      bytes: 0,
      lost: 0,
      polledAt: Date.now(),
      error: undefined,
    };
    this.byId.set(id, w);
    return {
      id,
      push: (e) => {
        if (!this.byId.has(id)) return;
        const n = eventBytes(e);
        const t = this.tenant(w.tenant);
        w.events.push(e);
        w.sizes.push(n);
        w.bytes += n;
        t.bytes += n;
        this.total += n;
        let drop = 0;
        let dropped = 0;
        while (
          drop < w.events.length &&
          (w.events.length - drop > MAX_BUFFERED ||
            w.bytes - dropped > MAX_BUFFERED_BYTES ||
            t.bytes - dropped > b.tenantBytes ||
            this.total - dropped > b.totalBytes)
        )
          dropped += w.sizes[drop++] ?? 0;
        if (drop === 0) return;
        w.events.splice(0, drop);
        w.sizes.splice(0, drop);
        w.bytes -= dropped;
        t.bytes -= dropped;
        this.total -= dropped;
        w.lost += drop;
      },
    };
  }

  /** The watch of a reserved watcher; its end is kept for the next poll. */
  started(id: string, handle: WatchHandle): void {
    const w = this.byId.get(id);
    if (!w) return handle.stop();
    w.handle = handle;
    handle.done.then(
      () => (w.error ??= new ForkdError("not_found", "the watched directory is gone")),
      (e: unknown) => (w.error ??= e),
    );
  }

  /** The events since the last poll (a watcher of another sandbox is not found). */
  take(sandboxId: string, id: string): FilesystemEvent[] {
    this.expire();
    const w = this.byId.get(id);
    if (!w || w.sandboxId !== sandboxId) throw new ForkdError("not_found", `watcher ${id} not found`);
    w.polledAt = Date.now();
    if (w.lost > 0) {
      const lost = w.lost;
      w.lost = 0;
      throw new ForkdError(
        "resource_exhausted",
        `${lost} events of watcher ${id} were lost (it was not polled fast enough); poll again for the rest`,
        { lost },
      );
    }
    const events = w.events;
    this.clear(w);
    if (events.length === 0 && w.error !== undefined) {
      this.remove(sandboxId, id);
      throw w.error instanceof Error ? w.error : new ForkdError("internal", "the watch ended");
    }
    return events;
  }

  private clear(w: Watcher): void {
    this.total -= w.bytes;
    const t = this.tenants.get(w.tenant);
    if (t) t.bytes -= w.bytes;
    w.events = [];
    w.sizes = [];
    w.bytes = 0;
  }

  remove(sandboxId: string, id: string): void {
    const w = this.byId.get(id);
    if (!w || w.sandboxId !== sandboxId) throw new ForkdError("not_found", `watcher ${id} not found`);
    this.drop(id, w);
  }

  private drop(id: string, w: Watcher): void {
    this.byId.delete(id);
    this.clear(w);
    const t = this.tenants.get(w.tenant);
    if (t && --t.watchers <= 0) this.tenants.delete(w.tenant);
    w.handle?.stop();
    w.release();
  }

  /** Removes the watchers nobody polled for idleMs. */
  expire(now = Date.now()): void {
    for (const [id, w] of this.byId) if (now - w.polledAt > this.idleMs) this.drop(id, w);
  }

  /** Stops every watcher (daemon shutdown). */
  close(): void {
    clearInterval(this.sweep);
    this.expire(Infinity);
  }
}
