/**
 * A bound on failed authentication per remote address, so a TCP listener cannot be used to
 * guess tokens at line rate: each address has a bucket of `burst` failures refilled at `rps`
 * per second. A failure is a request that presented a credential that did not authenticate,
 * or that needed one and had none. While an address's bucket is empty, every request from it
 * that presents a credential or needs one is refused (429) before any token is checked, so
 * the reply says nothing about whether a guess was right.
 *
 * IPv6 addresses count per /64 (what one host usually holds). The table is bounded: past
 * `maxEntries`, the least recently failed address is forgotten.
 */

export interface AuthFailureLimits {
  /** Failures refilled per second into each address's bucket (0: no limit). */
  rps: number;
  /** Failures an address may make at once after being quiet. */
  burst: number;
}

interface Bucket {
  tokens: number;
  at: number;
}

/** The key an address counts under: IPv4 as is (also IPv4-mapped IPv6), IPv6 by its /64. */
export function addressKey(addr: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(addr);
  if (mapped?.[1]) return mapped[1];
  if (!addr.includes(":")) return addr;
  const [left = "", right, ...more] = (addr.split("%")[0] ?? "").toLowerCase().split("::");
  if (more.length > 0) return addr;
  const l = left ? left.split(":") : [];
  const r = right ? right.split(":") : [];
  const zeros = right === undefined ? [] : Array<string>(Math.max(0, 8 - l.length - r.length)).fill("0");
  const groups = [...l, ...zeros, ...r].slice(0, 4).map((g) => (parseInt(g, 16) || 0).toString(16));
  return `${groups.join(":")}::/64`;
}

export class AuthFailureLimiter {
  private readonly table = new Map<string, Bucket>();

  constructor(
    readonly limits: AuthFailureLimits,
    private readonly maxEntries = 65_536,
    private readonly now: () => number = () => performance.now() / 1000,
  ) {}

  /** Seconds before `addr` may try again (0: it may now). */
  blockedFor(addr: string): number {
    const l = this.limits;
    if (l.rps <= 0) return 0;
    const key = addressKey(addr);
    const b = this.table.get(key);
    if (!b) return 0;
    const tokens = Math.min(l.burst, b.tokens + (this.now() - b.at) * l.rps);
    if (tokens >= l.burst) {
      this.table.delete(key);
      return 0;
    }
    return tokens >= 1 ? 0 : Math.max(1, Math.ceil((1 - tokens) / l.rps));
  }

  /** Counts one failure of `addr`. */
  fail(addr: string): void {
    const l = this.limits;
    if (l.rps <= 0) return;
    const key = addressKey(addr);
    const t = this.now();
    const b = this.table.get(key);
    const tokens = b ? Math.min(l.burst, b.tokens + (t - b.at) * l.rps) : l.burst;
    this.table.delete(key); // re-inserted last: the table's order is by latest failure
    this.table.set(key, { tokens: Math.max(0, tokens - 1), at: t });
    while (this.table.size > this.maxEntries) {
      const oldest = this.table.keys().next().value;
      if (oldest === undefined) break;
      this.table.delete(oldest);
    }
  }

  /** Addresses currently tracked (for tests). */
  get size(): number {
    return this.table.size;
  }
}
