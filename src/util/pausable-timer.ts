/**
 * A one-shot timer whose clock can stop: a deadline on the outside world that does not count the
 * time we ourselves hold it up (a paced stream whose consumer is slow). `restart()` makes it an
 * inactivity timer. Idempotent `clear()`; it never fires after it.
 */
export class PausableTimer {
  private timer: NodeJS.Timeout | undefined;
  private left: number;
  private startedAt = 0;
  private paused = false;
  private done = false;

  constructor(
    private readonly ms: number,
    private readonly fire: () => void,
  ) {
    this.left = ms;
    this.arm();
  }

  /** Stops the clock (no-op if stopped or done). */
  pause(): void {
    if (this.paused || this.done) return;
    this.paused = true;
    clearTimeout(this.timer);
    this.left = Math.max(0, this.left - (performance.now() - this.startedAt));
  }

  /** Lets the clock run again with the time that was left. */
  resume(): void {
    if (!this.paused || this.done) return;
    this.paused = false;
    this.arm();
  }

  /** Starts the whole period again (keeping paused if paused). */
  restart(): void {
    if (this.done) return;
    this.left = this.ms;
    if (!this.paused) {
      clearTimeout(this.timer);
      this.arm();
    }
  }

  clear(): void {
    this.done = true;
    clearTimeout(this.timer);
  }

  private arm(): void {
    this.startedAt = performance.now();
    this.timer = setTimeout(() => {
      if (this.done) return;
      this.done = true;
      this.fire();
    }, this.left);
  }
}
