/**
 * The pace of a streamed reply's reader, for a producer that can wait (the agent client's paced
 * handlers): enqueue() answers undefined while the reader wants more, else a promise that settles
 * at its next pull (or when it is gone or the reply has ended). The queue holds at most about
 * `strategy.highWaterMark` bytes before the producer is asked to wait. Nothing is enqueued after
 * the reply ended or its reader went away, and that never throws.
 */
import { ForkdError } from "../util/errors.js";

const HIGH_WATER_MARK = 256 << 10;

export class PacedReader {
  readonly strategy: QueuingStrategy<Uint8Array> = {
    highWaterMark: HIGH_WATER_MARK,
    size: (chunk) => chunk.byteLength,
  };
  private waiters: (() => void)[] = [];
  private state: "open" | "ended" | "gone" = "open";

  /** The reader went away (the stream was cancelled). */
  get isGone(): boolean {
    return this.state === "gone";
  }

  enqueue(
    controller: ReadableStreamDefaultController<Uint8Array>,
    chunk: Uint8Array,
  ): Promise<void> | undefined {
    if (this.state !== "open") return undefined;
    try {
      controller.enqueue(chunk);
    } catch {
      this.gone(); // cancelled in a way we did not see
      return undefined;
    }
    if ((controller.desiredSize ?? 0) > 0) return undefined;
    return new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  close(controller: ReadableStreamDefaultController<Uint8Array>): void {
    this.end(() => controller.close());
  }

  error(controller: ReadableStreamDefaultController<Uint8Array>, e: unknown): void {
    this.end(() => controller.error(e));
  }

  /** Throws if the reader is gone (for a producer that should stop then). */
  checkGone(): void {
    if (this.isGone) throw new ForkdError("unavailable", "the client went away");
  }

  /** From the stream's pull(): the reader wants more. */
  pulled(): void {
    this.wake();
  }

  /** From the stream's cancel(). */
  gone(): void {
    if (this.state === "open") this.state = "gone";
    this.wake();
  }

  private end(fn: () => void): void {
    if (this.state !== "open") return;
    this.state = "ended";
    try {
      fn();
    } catch {
      /* cancelled meanwhile */
    }
    this.wake();
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }
}
