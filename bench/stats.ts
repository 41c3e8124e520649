/** Sample statistics for the benchmarks: percentiles, medians, rounding. Pure functions. */

/**
 * The p-th percentile by rank: the sample at index floor(p/100 × n) of the sorted samples (the
 * last one for p = 100); NaN for no samples. What the older scripts (fork, branch, net) report.
 */
export function pct(xs: readonly number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  if (!s.length) return NaN;
  return s[Math.min(s.length - 1, Math.max(0, Math.floor((p / 100) * s.length)))] ?? NaN;
}

/** The median: the middle sample, or the mean of the middle two of an even count; NaN for none. */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (!s.length) return NaN;
  const mid = s.length >> 1;
  return s.length % 2 ? (s[mid] ?? NaN) : ((s[mid - 1] ?? NaN) + (s[mid] ?? NaN)) / 2;
}

/** Rounded to one decimal (NaN stays NaN). */
export const r1 = (x: number): number => Math.round(x * 10) / 10;

/** Rounded to two decimals (NaN stays NaN). */
export const r2 = (x: number): number => Math.round(x * 100) / 100;

export interface Summary {
  n: number;
  p50: number;
  p90: number;
  min: number;
  max: number;
  /** Every sample in the order measured, rounded to 0.1. */
  samples: number[];
}

/** p50 (the median), p90 (by rank), min and max of samples, rounded to 0.1. */
export function summarize(xs: readonly number[]): Summary {
  return {
    n: xs.length,
    p50: r1(median(xs)),
    p90: r1(pct(xs, 90)),
    min: r1(xs.length ? Math.min(...xs) : NaN),
    max: r1(xs.length ? Math.max(...xs) : NaN),
    samples: xs.map(r1),
  };
}
