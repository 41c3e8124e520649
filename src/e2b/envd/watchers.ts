/**
 * envd's polling watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher): a watch whose
 * events wait in a bounded buffer until polled. Bounded in number (per sandbox and in all), and
 * one not polled for IDLE_MS is removed (its watch stopped, its sandbox lease released).
 */
import { randomUUID } from "node:crypto";
import type { WatchHandle } from "../../agent/watch.js";
import { ForkdError } from "../../util/errors.js";
import type { FilesystemEvent } from "./gen/filesystem/filesystem_pb.js";

/** Events kept per watcher between polls; past it the oldest are dropped. */
export const MAX_BUFFERED = 10_000;
export const MAX_PER_SANDBOX = 64;
const MAX_WATCHERS = 1024;
/** A watcher nobody polled for this long is removed. */
export const IDLE_MS = 5 * 60_000;

interface Watcher {
  sandboxId: string;
  handle: WatchHandle | null;
  release: () => void;
  events: FilesystemEvent[];
  polledAt: number;
  /** Why its watch ended (the directory went away, the sandbox ended), once it has. */
  error: unknown;
}

export class Watchers {
  private readonly byId = new Map<string, Watcher>();

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
      polledAt: Date.now(),
      error: undefined,
    };
    this.byId.set(id, w);
    return {
      id,
      push: (e) => {
        w.events.push(e);
        if (w.events.length > MAX_BUFFERED) w.events.splice(0, w.events.length - MAX_BUFFERED);
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
    const events = w.events;
    w.events = [];
    if (events.length === 0 && w.error !== undefined) {
      this.remove(sandboxId, id);
      throw w.error instanceof Error ? w.error : new ForkdError("internal", "the watch ended");
    }
    return events;
  }

  remove(sandboxId: string, id: string): void {
    const w = this.byId.get(id);
    if (!w || w.sandboxId !== sandboxId) throw new ForkdError("not_found", `watcher ${id} not found`);
    this.byId.delete(id);
    w.handle?.stop();
    w.release();
  }

  /** Removes the watchers nobody polled for idleMs. */
  expire(now = Date.now()): void {
    for (const [id, w] of this.byId)
      if (now - w.polledAt > this.idleMs) {
        this.byId.delete(id);
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
