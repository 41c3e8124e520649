/**
 * How many pre-started VMMs each snapshot gets, host-wide (pool.ts applies it): every snapshot
 * keeps an exponentially decayed count of its forks; the host's total (a count and optionally a
 * memory bound) is spent on the snapshots with the highest counts, at most `perTag` each, and a
 * snapshot not forked within `idleMs` gets none (a branch forked once must not hold VMMs).
 */

export interface PoolLimits {
  /** At most this many pre-started VMMs per snapshot (FORKD_POOL_SIZE). */
  perTag: number;
  /** At most this many on the host (FORKD_POOL_MAX; 0: no pool). */
  max: number;
  /** At most this much memory (MiB, members' measured PSS; absent: no bound) (FORKD_POOL_MAX_MIB). */
  maxMiB?: number;
  /** A snapshot not forked (nor made) for this long loses its members. */
  idleMs: number;
  /** A fork's weight halves in this time. */
  halfLifeMs: number;
}

/** A snapshot's demand: its decayed fork count, as of `at`. */
export interface Usage {
  score: number;
  at: number;
}

/** The count `u` stands for at `now`. */
export function decayed(u: Usage, now: number, halfLifeMs: number): number {
  const dt = Math.max(0, now - u.at);
  return u.score * Math.pow(2, -dt / Math.max(1, halfLifeMs));
}

/** `u` after one more fork at `now`. */
export function bump(u: Usage | undefined, now: number, halfLifeMs: number): Usage {
  return { score: (u ? decayed(u, now, halfLifeMs) : 0) + 1, at: now };
}

/**
 * How many members each snapshot should have now. `memMiB(tag)`: what one member of it costs
 * (used only with `maxMiB`). Ties go to the snapshot forked most recently.
 */
export function poolTargets(
  usage: ReadonlyMap<string, Usage>,
  now: number,
  limits: PoolLimits,
  memMiB: (tag: string) => number,
): Map<string, number> {
  const out = new Map<string, number>();
  const live = [...usage]
    .filter(([, u]) => now - u.at <= limits.idleMs)
    .map(([tag, u]) => ({ tag, score: decayed(u, now, limits.halfLifeMs), at: u.at }))
    .sort((a, b) => b.score - a.score || b.at - a.at || (a.tag < b.tag ? -1 : 1));
  let count = 0;
  let mib = 0;
  for (const { tag } of live) {
    let n = 0;
    const each = Math.max(0, memMiB(tag));
    while (n < limits.perTag && count < limits.max) {
      if (limits.maxMiB !== undefined && mib + each > limits.maxMiB) break;
      n++;
      count++;
      mib += each;
    }
    if (n > 0) out.set(tag, n);
  }
  return out;
}
