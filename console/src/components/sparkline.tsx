/** A small SVG line of one series' recent points, with its last value as text. */
import type { Point } from "../lib/series-history";

export function Sparkline({
  points,
  label,
  w = 160,
  h = 32,
}: {
  points: Point[];
  label: string;
  w?: number;
  h?: number;
}) {
  const vs = points.map((p) => p.v);
  const min = Math.min(...vs);
  const max = Math.max(...vs);
  const span = max - min || 1;
  const step = points.length > 1 ? w / (points.length - 1) : 0;
  const d = points
    .map(
      (p, i) =>
        `${i === 0 ? "M" : "L"}${(i * step).toFixed(1)},${(h - 2 - ((p.v - min) / span) * (h - 4)).toFixed(1)}`,
    )
    .join(" ");
  return (
    <svg class="spark" width={w} height={h} viewBox={`0 0 ${w} ${h}`} role="img" aria-label={label}>
      <path d={d} />
    </svg>
  );
}
