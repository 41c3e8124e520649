/** The host's health: accelerator, sandboxes, the warm pool per snapshot and the network slots. */
import type { Health } from "../api/types";

export function HealthPanel({ h }: { h: Health }) {
  const pool = h.pool_state;
  const net = h.network;
  return (
    <section aria-label="Health">
      <h2>Health</h2>
      <dl class="summary">
        <dt>Status</dt>
        <dd>{h.ok ? "ok" : "not ok"}</dd>
        <dt>Accelerator</dt>
        <dd>
          {h.accel}
          {h.accel_reason ? ` (${h.accel_reason})` : ""}
        </dd>
        <dt>Sandboxes</dt>
        <dd>{h.sandboxes}</dd>
        {pool && (
          <>
            <dt>Pool</dt>
            <dd>
              {pool.total} of {pool.max} ({pool.hot} hot, {pool.cold} cold), {pool.memory_mib} MiB
              {pool.max_mib === null ? "" : ` of ${pool.max_mib} MiB`}
            </dd>
          </>
        )}
        {net && (
          <>
            <dt>Network</dt>
            <dd>
              user {net.user ? "yes" : "no"}, netns {net.netns ? "yes" : "no"}
              {net.slots ? `; slots ${net.slots.busy} busy, ${net.slots.free} free of ${net.slots.max}` : ""}
            </dd>
          </>
        )}
      </dl>
      <table aria-label="Warm pool by snapshot">
        <thead>
          <tr>
            <th scope="col">Snapshot</th>
            <th scope="col">Waiting</th>
            <th scope="col">Hot</th>
            <th scope="col">Target</th>
            <th scope="col">Score</th>
          </tr>
        </thead>
        <tbody>
          {Object.entries(h.pool).map(([tag, n]) => {
            const t = pool?.tags[tag];
            return (
              <tr key={tag}>
                <th scope="row">{tag}</th>
                <td>{n}</td>
                <td>{t?.hot ?? "—"}</td>
                <td>{t?.target ?? "—"}</td>
                <td>{t ? t.score.toFixed(2) : "—"}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </section>
  );
}
