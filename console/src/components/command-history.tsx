/** The commands started through the API that still run in the sandbox (GET .../commands), refreshed every 5 s. */
import { commands } from "../api/sandboxes";
import { usePoll } from "../lib/use-poll";

export function CommandHistory({ id }: { id: string }) {
  const list = usePoll(() => commands(id), 5000, id);
  const cmds = list.value?.commands ?? [];
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
                  <code>{Array.isArray(c.cmd) ? c.cmd.join(" ") : c.cmd}</code>
                </td>
                <td>{c.started}</td>
                <td>{c.pty ? "yes" : "no"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
