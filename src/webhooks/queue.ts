/**
 * One webhook's queue of undelivered events, kept in memory and written to its file atomically
 * (whole, after each change: writes are coalesced, one at a time, so a burst costs one write or
 * two). A daemon that restarts reads it back: an event is lost only if the daemon dies before the
 * write that follows it. Bounded: past `max` events the oldest is dropped (and counted).
 */
import { readFile, rm } from "node:fs/promises";
import { z } from "zod";
import { writeJsonAtomic } from "../util/index.js";

export const QueuedEventSchema = z.object({
  /** The event's id (also the receiver's de-duplication key). */
  id: z.string().max(64),
  type: z.string().max(64),
  /** The body sent, fixed when queued: every attempt sends the same bytes. */
  body: z.string().max(1 << 20),
  /** When queued (ms since the epoch). */
  queued: z.number(),
  /** Attempts made so far. */
  attempts: z.number().int().min(0),
  /** When it is due next (ms since the epoch). */
  next: z.number(),
});
export type QueuedEvent = z.infer<typeof QueuedEventSchema>;

const FileSchema = z.object({ events: z.array(QueuedEventSchema).max(1_000_000) });

export class WebhookQueue {
  private items: QueuedEvent[] = [];
  private dirty = false;
  private writing: Promise<void> | null = null;
  private gone = false;

  private constructor(
    readonly path: string,
    private readonly max: number,
    private readonly onError: (e: unknown) => void,
  ) {}

  /** The queue written at `path` (none there: empty; unreadable: empty, reported to onError). */
  static async open(path: string, max: number, onError: (e: unknown) => void): Promise<WebhookQueue> {
    const q = new WebhookQueue(path, max, onError);
    let text: string | null = null;
    try {
      text = await readFile(path, "utf8");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ENOENT") onError(e);
    }
    if (text !== null) {
      try {
        q.items = FileSchema.parse(JSON.parse(text)).events;
      } catch (e) {
        onError(e);
      }
    }
    // A cap lowered since: the oldest go.
    if (q.items.length > max) q.items.splice(0, q.items.length - max);
    return q;
  }

  get size(): number {
    return this.items.length;
  }

  list(): readonly QueuedEvent[] {
    return this.items;
  }

  /** Queues `e`; returns how many old events it pushed out (0 or more). */
  push(e: QueuedEvent): number {
    this.items.push(e);
    const over = Math.max(0, this.items.length - this.max);
    if (over > 0) this.items.splice(0, over);
    this.save();
    return over;
  }

  remove(id: string): void {
    const i = this.items.findIndex((x) => x.id === id);
    if (i < 0) return;
    this.items.splice(i, 1);
    this.save();
  }

  /** The event due first (null: none queued). */
  first(): QueuedEvent | null {
    let best: QueuedEvent | null = null;
    for (const x of this.items) if (!best || x.next < best.next) best = x;
    return best;
  }

  /** Tells the queue one of its events changed (attempts, next): it is written again. */
  changed(): void {
    this.save();
  }

  private save(): void {
    if (this.gone) return;
    this.dirty = true;
    this.writing ??= this.writeLoop().finally(() => {
      this.writing = null;
    });
  }

  private async writeLoop(): Promise<void> {
    while (this.dirty && !this.gone) {
      this.dirty = false;
      try {
        await writeJsonAtomic(this.path, { events: this.items }, 0o600);
      } catch (e) {
        this.onError(e);
        return;
      }
    }
  }

  /** Waits until what was queued is on disk (a write under way, and one more if it changed since). */
  async flush(): Promise<void> {
    for (;;) {
      const w = this.writing;
      if (w) await w;
      else if (this.dirty && !this.gone) this.save();
      else return;
    }
  }

  /** Forgets the queue and its file (the webhook was deleted). */
  async destroy(): Promise<void> {
    this.gone = true;
    this.items = [];
    while (this.writing) await this.writing;
    await rm(this.path, { force: true });
  }
}
