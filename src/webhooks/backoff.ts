/**
 * When a failed delivery is tried again: exponential backoff with jitter, bounded. Attempt n
 * (1: the first retry) waits base·2^(n-1), capped at `maxMs`, of which a random half is jitter
 * (so receivers coming back are not hit by every sender at once). A delivery is given up after
 * `maxAttempts` attempts in all: with the defaults (1 s, 10 min, 15) about an hour after the event.
 */
export interface RetryPolicy {
  baseMs: number;
  maxMs: number;
  /** Attempts in all, the first included. */
  maxAttempts: number;
}

export const DEFAULT_RETRY: RetryPolicy = { baseMs: 1_000, maxMs: 600_000, maxAttempts: 15 };

/** The wait before the next attempt after `failed` failed ones (>= 1); `random` in [0, 1). */
export function retryDelayMs(failed: number, p: RetryPolicy, random: () => number = Math.random): number {
  const exp = Math.min(p.maxMs, p.baseMs * 2 ** Math.min(Math.max(failed - 1, 0), 40));
  return Math.round(exp / 2 + (exp / 2) * random());
}

/** The longest a delivery may be retried under `p` (every wait at its longest): what the docs quote. */
export function retryHorizonMs(p: RetryPolicy): number {
  let total = 0;
  for (let n = 1; n < p.maxAttempts; n++) total += Math.min(p.maxMs, p.baseMs * 2 ** Math.min(n - 1, 40));
  return total;
}
