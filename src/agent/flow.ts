/**
 * Host side of one paced stream (EXEC output, READ data): docs/agent-protocol.md "Flow control".
 * Bytes handed to the consumer count as held until its handler's promise settles; consumed bytes
 * go back to the guest as WINDOW credit once the agent has said it honours windows. An agent that
 * has not (an old one) is held back by the client pausing the whole connection instead.
 */

/** Credit a paced stream starts with; also what the consumer may hold before the guest stops. */
export const WINDOW = 2 << 20;
/** Credit is returned in batches of at least this many bytes. */
const CREDIT_BATCH = WINDOW / 4;

/**
 * What a consumer's handler returns: a promise (thenable) means "held until it settles";
 * anything else means consumed at once.
 */
export type Consumed = unknown;

export const isThenable = (r: unknown): r is PromiseLike<unknown> =>
  typeof r === "object" && r !== null && typeof (r as { then?: unknown }).then === "function";

export class StreamFlow {
  /** The agent echoed WINDOW: it sends no more than the credit. */
  paced = false;
  /** Delivered to the consumer, not yet consumed. */
  held = 0;
  private owed = 0;
  private ended = false;

  constructor(
    /** Sends a WINDOW frame granting `bytes` more. */
    private readonly credit: (bytes: number) => void,
    /** Called whenever `held` changed (the client re-checks its pause and the stream its timer). */
    private readonly changed: () => void,
  ) {}

  /** The consumer holds a whole window: the guest has (or should have) stopped sending. */
  get full(): boolean {
    return this.held >= WINDOW;
  }

  /** `n` bytes went to the consumer, whose handler returned `r`. */
  deliver(n: number, r: Consumed): void {
    this.held += n;
    if (isThenable(r)) {
      const done = () => this.consume(n);
      r.then(done, done);
      this.changed();
    } else {
      this.consume(n);
    }
  }

  /** The stream is over: nothing more is credited (late promises only update `held`). */
  end(): void {
    this.ended = true;
  }

  private consume(n: number): void {
    this.held -= n;
    this.owed += n;
    if (this.paced && !this.ended && this.owed >= CREDIT_BATCH) {
      const bytes = this.owed;
      this.owed = 0;
      this.credit(bytes);
    }
    this.changed();
  }
}
