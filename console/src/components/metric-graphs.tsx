/** The Prometheus series as sparklines (counters as per-second rates), filtered by name. */
import { useState } from "preact/hooks";
import type { History } from "../lib/series-history";
import { Sparkline } from "./sparkline";

const MAX_SHOWN = 60;

function fmt(v: number): string {
  return Math.abs(v) >= 1000 || Number.isInteger(v) ? v.toFixed(0) : v.toPrecision(3);
}

export function MetricGraphs({ history }: { history: History }) {
  const [filter, setFilter] = useState("forkd_");
  const keys = Object.keys(history.series)
    .filter((k) => k.includes(filter))
    .sort();
  return (
    <section aria-label="Metrics">
      <h2>Metrics</h2>
      <label>
        Series filter
        <input type="search" value={filter} onInput={(e) => setFilter(e.currentTarget.value)} />
      </label>
      <p class="count">
        {keys.length} series{keys.length > MAX_SHOWN ? `, first ${MAX_SHOWN} shown` : ""}, sampled every 5 s
      </p>
      <ul class="graphs">
        {keys.slice(0, MAX_SHOWN).map((k) => {
          const pts = history.series[k] ?? [];
          const last = pts[pts.length - 1];
          const unit = history.rate[k] ? "/s" : "";
          return (
            <li key={k}>
              <code title={k}>{k}</code>
              <Sparkline points={pts} label={`${k}: ${last ? fmt(last.v) : "—"}${unit}`} />
              <span class="value">
                {last ? fmt(last.v) : "—"}
                {unit}
              </span>
            </li>
          );
        })}
      </ul>
    </section>
  );
}
