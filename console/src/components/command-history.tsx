/**
 * A sandbox's commands started through the API: the ones still running (GET .../commands) and
 * the last ones that ended, with how (GET .../commands/history), refreshed every 5 s.
 */
import { commandHistory, commands } from "../api/sandboxes";
import { usePoll } from "../lib/use-poll";

const text = (cmd: string[] | string) => (Array.isArray(cmd) ? cmd.join(" ") : cmd);

function how(c: { exit_code: number | null; signal: number | null; timed_out: boolean }): string {
  if (c.timed_out) return c.exit_code === null ? "timed out" : `timed out (exit ${c.exit_code})`;
  if (c.exit_code !== null) return `exit ${c.exit_code}`;
  return c.signal !== null ? `signal ${c.signal}` : "lost";
}

export function CommandHistory({ id }: { id: string }) {
  const list = usePoll(() => commands(id), 5000, id);
  const past = usePoll(() => commandHistory(id), 5000, id);
  const cmds = list.value?.commands ?? [];
  const ended = [...(past.value?.commands ?? [])].reverse();
  return (
    <section aria-label="Commands">
      <h2>Commands</h2>
      {list.error && <p class="status error">{list.error}</p>}
      {cmds.length === 0 ? (
        <p>No commands running.</p>
      ) : (
        <table aria-label="Running commands">
          <thead>
            <tr>
              <th scope="col">PID</th>
              <th scope="col">Command</th>
              <th scope="col">Started</th>
              <th scope="col">PTY</th>
            </tr>
          </thead>
          <tbody>
            {cmds.map((c) => (
              <tr key={c.pid}>
                <td>{c.pid}</td>
                <td>
                  <code>{text(c.cmd)}</code>
                </td>
                <td>{c.started}</td>
                <td>{c.pty ? "yes" : "no"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <h3>Ended</h3>
      {past.error && <p class="status error">{past.error}</p>}
      {ended.length === 0 ? (
        <p>No command has ended yet.</p>
      ) : (
        <table aria-label="Ended commands">
          <thead>
            <tr>
              <th scope="col">PID</th>
              <th scope="col">Command</th>
              <th scope="col">Started</th>
              <th scope="col">Ended</th>
              <th scope="col">Result</th>
            </tr>
          </thead>
          <tbody>
            {ended.map((c) => (
              <tr key={`${c.pid}-${c.started}`}>
                <td>{c.pid}</td>
                <td>
                  <code>{text(c.cmd)}</code>
                </td>
                <td>{c.started}</td>
                <td>{c.ended}</td>
                <td>{how(c)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
