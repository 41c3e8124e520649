/**
 * envd's polling watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher): a watch whose
 * events wait in a bounded buffer until polled. Bounded in number (per sandbox and in all), its
 * events in number and bytes per watcher and in bytes over all watchers (past a bound the
 * oldest are dropped, and the next poll says how many were lost before it returns the rest),
 * and one not polled for IDLE_MS is removed (its watch stopped, its sandbox lease released).
 */
import { randomUUID } from "node:crypto";
import type { WatchHandle } from "../../agent/watch.js";
import { ForkdError } from "../../util/errors.js";
import type { FilesystemEvent } from "./gen/filesystem/filesystem_pb.js";

/** Events kept per watcher between polls; past it the oldest are dropped. */
export const MAX_BUFFERED = 10_000;
/** Bytes of events kept per watcher, and over all watchers (an event's size is estimated). */
export const MAX_BUFFERED_BYTES = 2 << 20;
export const MAX_TOTAL_BYTES = 64 << 20;
export const MAX_PER_SANDBOX = 64;
const MAX_WATCHERS = 1024;
/** A watcher nobody polled for this long is removed. */
export const IDLE_MS = 5 * 60_000;

interface Watcher {
  sandboxId: string;
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

  private readonly sweep: NodeJS.Timeout;

  constructor(private readonly idleMs = IDLE_MS) {
    this.sweep = setInterval(() => this.expire(), Math.min(idleMs, 60_000));
    this.sweep.unref();
  }

  /** Reserves a watcher for `sandboxId`; `release` is called when it is removed. */
  reserve(sandboxId: string, release: () => void): { id: string; push: (e: FilesystemEvent) => void } {
    this.expire();
    const mine = [...this.byId.values()].filter((w) => w.sandboxId === sandboxId).length;
    if (mine >= MAX_PER_SANDBOX || this.byId.size >= MAX_WATCHERS)
      throw new ForkdError("resource_exhausted", `too many watchers (${MAX_PER_SANDBOX} per sandbox)`);
    const id = randomUUID();
    const w: Watcher = {
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
        w.events.push(e);
        w.sizes.push(n);
        w.bytes += n;
        this.total += n;
        let drop = 0;
        let dropped = 0;
        while (
          drop < w.events.length &&
          (w.events.length - drop > MAX_BUFFERED ||
            w.bytes - dropped > MAX_BUFFERED_BYTES ||
            this.total - dropped > MAX_TOTAL_BYTES)
        )
          dropped += w.sizes[drop++] ?? 0;
        if (drop === 0) return;
        w.events.splice(0, drop);
        w.sizes.splice(0, drop);
        w.bytes -= dropped;
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
    w.events = [];
    w.sizes = [];
    w.bytes = 0;
  }

  remove(sandboxId: string, id: string): void {
    const w = this.byId.get(id);
    if (!w || w.sandboxId !== sandboxId) throw new ForkdError("not_found", `watcher ${id} not found`);
    this.byId.delete(id);
    this.clear(w);
    w.handle?.stop();
    w.release();
  }

  /** Removes the watchers nobody polled for idleMs. */
  expire(now = Date.now()): void {
    for (const [id, w] of this.byId)
      if (now - w.polledAt > this.idleMs) {
        this.byId.delete(id);
        this.clear(w);
        w.handle?.stop();
        w.release();
      }
  }

  /** Stops every watcher (daemon shutdown). */
  close(): void {
    clearInterval(this.sweep);
    this.expire(Infinity);
  }
}
