/**
 * Keys whose state in etcd must catch up with this node's, written in batches: marked as they
 * change, flushed after a short delay (so a burst is one write, and a node writes a few times
 * a second at most), one flush at a time. A flush that fails keeps its keys and is tried again
 * with a growing delay (a node cut off retries every few seconds until it re-joins, when
 * flushNow() runs at once).
 */
export interface DirtySetOptions {
  /** How long a change waits for others before the flush. */
  delayMs: number;
  /** Writes the state of `keys` as it is now (it reads the state itself: marks carry none). */
  flush: (keys: string[]) => Promise<void>;
  onError: (e: unknown, keys: number) => void;
}

const MAX_RETRY_MS = 10_000;

export class DirtySet {
  private readonly keys = new Set<string>();
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
  private failures = 0;
  private closed = false;

  constructor(private readonly o: DirtySetOptions) {}

  get size(): number {
    return this.keys.size;
  }

  mark(key: string): void {
    if (this.closed) return;
    this.keys.add(key);
    this.schedule(this.o.delayMs);
  }

  /** Flushes what is marked now (after a flush in progress); never throws. */
  async flushNow(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.failures = 0;
    await this.run();
  }

  /** No more flushes (a last flushNow() may be awaited first). */
  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private schedule(ms: number): void {
    if (this.timer || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.run();
    }, ms);
    this.timer.unref();
  }

  private async run(): Promise<void> {
    while (this.flushing) await this.flushing;
    if (this.keys.size === 0 || this.closed) return;
    const batch = [...this.keys];
    this.keys.clear();
    this.flushing = this.o.flush(batch).then(
      () => {
        this.failures = 0;
      },
      (e: unknown) => {
        for (const k of batch) this.keys.add(k);
        this.failures++;
        this.o.onError(e, batch.length);
      },
    );
    try {
      await this.flushing;
    } finally {
      this.flushing = null;
    }
    if (this.keys.size > 0)
      this.schedule(this.failures > 0 ? Math.min(250 * 2 ** this.failures, MAX_RETRY_MS) : this.o.delayMs);
  }
}
