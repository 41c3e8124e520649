/** The audit lines that named a sandbox or a snapshot (newest last), refreshed every 5 s. */
import { auditLines } from "../api/logs";
import { usePoll } from "../lib/use-poll";

export function AuditTable({ query }: { query: { sandbox?: string; snapshot?: string } }) {
  const key = query.sandbox ?? query.snapshot ?? "";
  const audit = usePoll(() => auditLines({ ...query, limit: 100 }), 5000, key);
  const lines = audit.value?.lines ?? [];
  return (
    <section aria-label="Audit">
      <h2>Audit</h2>
      {audit.error && <p class="status error">{audit.error}</p>}
      {lines.length === 0 ? (
        <p>No audit lines.</p>
      ) : (
        <div class="table-wrap tail">
          <table aria-label="Audit lines">
            <thead>
              <tr>
                <th scope="col">Time</th>
                <th scope="col">Caller</th>
                <th scope="col">Action</th>
                <th scope="col">Status</th>
                <th scope="col">Result</th>
                <th scope="col">ms</th>
              </tr>
            </thead>
            <tbody>
              {lines.map((l) => (
                <tr key={l.request_id}>
                  <td>{l.ts}</td>
                  <td>{l.caller}</td>
                  <td>{l.action}</td>
                  <td>{l.status}</td>
                  <td>{l.result}</td>
                  <td>{Math.round(l.duration_ms)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
