/**
 * Client-side history of Prometheus series, sampled every few seconds: bounded points per series,
 * counters turned into per-second rates, histogram buckets left out (their _sum and _count stay).
 */
import { familyOf, parseExposition, seriesKey } from "./prometheus.js";

export interface Point {
  t: number;
  v: number;
}

export interface History {
  /** Series key → its points, oldest first. */
  series: Record<string, Point[]>;
  /** Series key → whether it is drawn as a rate (a counter). */
  rate: Record<string, boolean>;
  /** The raw previous counter values, for the next rate. */
  last: Record<string, Point>;
}

export const EMPTY_HISTORY: History = { series: {}, rate: {}, last: {} };

export function addSample(h: History, text: string, t: number, keep: number): History {
  const { samples, types } = parseExposition(text);
  const series: Record<string, Point[]> = {};
  const rate: Record<string, boolean> = {};
  const last: Record<string, Point> = {};
  for (const s of samples) {
    if (s.name.endsWith("_bucket") || !Number.isFinite(s.value)) continue;
    const key = seriesKey(s);
    const type = types[familyOf(s.name, types)] ?? "untyped";
    const isRate = type === "counter" || s.name.endsWith("_sum") || s.name.endsWith("_count");
    const before = h.series[key] ?? [];
    let v = s.value;
    if (isRate) {
      last[key] = { t, v: s.value };
      const prev = h.last[key];
      if (!prev || t <= prev.t || s.value < prev.v) continue;
      v = ((s.value - prev.v) * 1000) / (t - prev.t);
    }
    rate[key] = isRate;
    series[key] = [...before, { t, v }].slice(-keep);
  }
  return { series, rate, last };
}
