/**
 * Per-caller limits, so one client cannot starve the daemon: a token bucket of requests
 * (`rps` refilled per second, `burst` at most), a cap on requests in flight, and a smaller cap
 * on heavy operations in flight (those that start or stop VMs or write snapshots).
 *
 * Keys are authenticated callers only (bounded by the number of tokens), so the table is
 * bounded too; idle entries are dropped as they are met.
 */

export interface RateLimits {
  /** Requests per second refilled into each caller's bucket (0: no rate limit). */
  rps: number;
  /** Bucket size: requests a caller may send at once after being idle. */
  burst: number;
  /** Requests of one caller in flight at once (0: no limit). */
  maxInflight: number;
  /** Heavy operations of one caller in flight at once (0: no limit). */
  maxHeavy: number;
}

export type Admission =
  | { ok: true; release: () => void }
  | { ok: false; reason: "rate" | "inflight" | "heavy"; retryAfterS: number };

interface Entry {
  tokens: number;
  at: number;
  inflight: number;
  heavy: number;
}

export class RateLimiter {
  private readonly table = new Map<string, Entry>();

  constructor(
    readonly limits: RateLimits,
    private readonly now: () => number = () => performance.now() / 1000,
  ) {}

  /** Admits one request of `key` (release() it when its reply is done), or says when to retry. */
  admit(key: string, heavy: boolean): Admission {
    const l = this.limits;
    const t = this.now();
    let e = this.table.get(key);
    if (!e) {
      e = { tokens: l.burst, at: t, inflight: 0, heavy: 0 };
      this.table.set(key, e);
    }
    if (l.rps > 0) {
      e.tokens = Math.min(l.burst, e.tokens + (t - e.at) * l.rps);
      e.at = t;
      if (e.tokens < 1) return { ok: false, reason: "rate", retryAfterS: Math.ceil((1 - e.tokens) / l.rps) };
    }
    if (l.maxInflight > 0 && e.inflight >= l.maxInflight)
      return { ok: false, reason: "inflight", retryAfterS: 1 };
    if (heavy && l.maxHeavy > 0 && e.heavy >= l.maxHeavy)
      return { ok: false, reason: "heavy", retryAfterS: 1 };
    if (l.rps > 0) e.tokens -= 1;
    e.inflight++;
    if (heavy) e.heavy++;
    const entry = e;
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        entry.inflight--;
        if (heavy) entry.heavy--;
        this.forgetIfIdle(key, entry);
      },
    };
  }

  /** Entries currently kept (for tests and metrics). */
  get size(): number {
    return this.table.size;
  }

  private forgetIfIdle(key: string, e: Entry): void {
    if (e.inflight > 0) return;
    const full =
      this.limits.rps <= 0 || e.tokens + (this.now() - e.at) * this.limits.rps >= this.limits.burst;
    if (full) this.table.delete(key);
  }
}
