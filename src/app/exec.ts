/**
 * EXEC AS A CALLER, the part that is not the command registry's (src/sandbox/commands/): a
 * command or cell run for a caller is timed from its start to its exit, and that latency or its
 * failure recorded once, here, whichever door started it. (Which sandbox the caller may run in
 * is ./scope.ts; the audit line is its door's edge's: ./call-record.ts.)
 */
import type { Services } from "./services.js";

export class CommandRun {
  private readonly t0 = performance.now();

  /** `op`: what the metrics name a failure of (execStream, evalStream, ...). */
  constructor(
    private readonly s: Services,
    private readonly op: string,
  ) {}

  /** Milliseconds since the start. */
  elapsedMs(): number {
    return performance.now() - this.t0;
  }

  /** The command exited (whatever its status): its latency is recorded. */
  exited(): void {
    this.s.metrics.exec(this.elapsedMs() / 1000);
  }

  /** The run failed with error `code` (it never exited). */
  failed(code: string): void {
    this.s.metrics.failure(this.op, code);
  }
}
