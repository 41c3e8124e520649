/** The host page: health (accelerator, pools, network slots) and the Prometheus series sampled every 5 s into sparklines. */
import { useEffect, useState } from "preact/hooks";
import { health, metricsText } from "../api/host";
import { messageOf } from "../api/http";
import { HealthPanel } from "../components/health-panel";
import { MetricGraphs } from "../components/metric-graphs";
import { addSample, EMPTY_HISTORY } from "../lib/series-history";
import { usePoll } from "../lib/use-poll";

const EVERY_MS = 5000;
const KEEP = 120;

export function HostPage() {
  const h = usePoll(health, EVERY_MS, "health");
  const [history, setHistory] = useState(EMPTY_HISTORY);
  const [metricsError, setMetricsError] = useState<string | null>(null);
  useEffect(() => {
    let live = true;
    const sample = () =>
      metricsText().then(
        (text) => {
          if (!live) return;
          setMetricsError(null);
          setHistory((old) => addSample(old, text, Date.now(), KEEP));
        },
        (e: unknown) => {
          if (live) setMetricsError(messageOf(e));
        },
      );
    void sample();
    const t = setInterval(() => void sample(), EVERY_MS);
    return () => {
      live = false;
      clearInterval(t);
    };
  }, []);
  return (
    <section aria-labelledby="host-h">
      <h1 id="host-h">Host</h1>
      {h.error && <p class="status error">{h.error}</p>}
      {h.value && <HealthPanel h={h.value} />}
      {metricsError && <p class="status error">metrics: {metricsError}</p>}
      <MetricGraphs history={history} />
    </section>
  );
}
