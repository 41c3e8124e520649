/**
 * A bounded queue of events between a producer in the daemon (a process's output, a watch) and
 * one streamed reply: push() says whether it is under its byte bound, room() waits until it is
 * (or the queue is closed), and next() gives the reply its next event, or a keepalive after
 * `keepaliveMs` without one, or null once closed and empty. A reply that hangs up closes it.
 */

/** What a queue closed with, as something to throw. */
const asError = (e: unknown): Error => (e instanceof Error ? e : new Error(String(e)));

export type Next<T> = { event: T } | { keepalive: true } | null;

export class EventQueue<T> {
  private readonly items: { event: T; size: number }[] = [];
  private bytes = 0;
  private closedWith: { error: unknown } | null = null;
  private wakeReader: (() => void) | null = null;
  private roomWaiters: (() => void)[] = [];

  constructor(private readonly highWater = 1 << 20) {}

  get closed(): boolean {
    return this.closedWith !== null;
  }

  get full(): boolean {
    return this.bytes >= this.highWater;
  }

  /** Queues an event (dropped once closed); true while under the bound. */
  push(event: T, size = 0): boolean {
    if (this.closedWith) return true;
    this.items.push({ event, size });
    this.bytes += size;
    this.wake();
    return !this.full;
  }

  /** Resolves once under the bound or closed. */
  room(): Promise<void> {
    if (!this.full || this.closedWith) return Promise.resolve();
    return new Promise((resolve) => this.roomWaiters.push(resolve));
  }

  /** No more events: next() drains what is queued, then ends (throws `error` if given). */
  close(error?: unknown): void {
    if (this.closedWith) return;
    this.closedWith = { error };
    this.wake();
    this.freeRoom();
  }

  /** Drops what is queued and closes (the reader is gone). */
  abandon(): void {
    this.items.length = 0;
    this.bytes = 0;
    this.close();
  }

  /** The next event, a keepalive past `keepaliveMs` idle, or null at the end; `signal` ends it too. */
  async next(keepaliveMs: number, signal?: AbortSignal): Promise<Next<T>> {
    for (;;) {
      const item = this.items.shift();
      if (item) {
        this.bytes -= item.size;
        if (!this.full) this.freeRoom();
        return { event: item.event };
      }
      if (this.closedWith) {
        if (this.closedWith.error !== undefined) throw asError(this.closedWith.error);
        return null;
      }
      if (signal?.aborted) return null;
      const woke = await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => done(false), keepaliveMs);
        const onAbort = () => done(true);
        const done = (w: boolean) => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          this.wakeReader = null;
          resolve(w);
        };
        signal?.addEventListener("abort", onAbort, { once: true });
        this.wakeReader = () => done(true);
      });
      if (!woke) return { keepalive: true };
    }
  }

  private wake(): void {
    const w = this.wakeReader;
    this.wakeReader = null;
    w?.();
  }

  private freeRoom(): void {
    const w = this.roomWaiters;
    this.roomWaiters = [];
    for (const f of w) f();
  }
}
