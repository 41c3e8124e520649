/**
 * How often a connection may be made again after garbage from the guest: at most `max` times
 * within a sliding window. Past that the guest is taken to corrupt its channel on purpose and
 * the client gives up (connection.ts).
 */
export class ResyncBudget {
  private readonly times: number[] = [];

  constructor(
    readonly max: number,
    readonly windowMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** Takes one reconnection; false (and nothing taken) when `max` were taken within the window. */
  take(): boolean {
    const now = this.now();
    while (this.times.length > 0 && this.times[0]! < now - this.windowMs) this.times.shift();
    if (this.times.length >= this.max) return false;
    this.times.push(now);
    return true;
  }

  /** Reconnections taken within the window, as of the last take(). */
  get used(): number {
    return this.times.length;
  }
}
