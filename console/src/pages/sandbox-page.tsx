/**
 * One sandbox's page: its summary (its node, in a cluster) and actions, terminal, files,
 * commands, console log tail and audit lines.
 */
import { consoleTail } from "../api/logs";
import { AuditTable } from "../components/audit-table";
import { CommandHistory } from "../components/command-history";
import { FileBrowser } from "../components/file-browser";
import { limitsText } from "../components/limits-text";
import { SandboxActions } from "../components/sandbox-actions";
import { StatusLine } from "../components/status-line";
import { Terminal } from "../components/terminal";
import { TextTail } from "../components/text-tail";
import { age, bytes } from "../lib/format";
import type { LiveState } from "../lib/live-state";
import { hrefOf } from "../lib/route";
import { useAction } from "../lib/use-action";
import { useNow } from "../lib/use-now";

export function SandboxPage({ live, id }: { live: LiveState; id: string }) {
  const s = live.sandboxes[id];
  const usage = live.usage[id];
  const action = useAction();
  const now = useNow();
  return (
    <section aria-labelledby="sandbox-h">
      <h1 id="sandbox-h">Sandbox {id}</h1>
      {!s ? (
        <p>{live.connected ? "This sandbox is gone." : "Loading…"}</p>
      ) : (
        <>
          <dl class="summary">
            <dt>State</dt>
            <dd>
              <span class={`pill ${s.state}`}>{s.state}</span>
            </dd>
            <dt>Snapshot</dt>
            <dd>
              <a href={hrefOf({ page: "snapshots", tag: s.tag })}>{s.tag}</a>
            </dd>
            {s.node !== null && (
              <>
                <dt>Node</dt>
                <dd>{s.node}</dd>
              </>
            )}
            <dt>Age</dt>
            <dd>{age(s.created, now)}</dd>
            <dt>CPU</dt>
            <dd>{usage ? `${usage.cpu_percent.toFixed(1)}%` : "—"}</dd>
            <dt>Memory</dt>
            <dd>{usage ? bytes(usage.memory_bytes) : "—"}</dd>
            <dt>Network</dt>
            <dd>
              {s.network.mode}
              {s.network.guest_ip ? ` (${s.network.guest_ip})` : ""}
            </dd>
            <dt>Limits</dt>
            <dd>{limitsText(s.limits)}</dd>
            <dt>Idle timeout</dt>
            <dd>{s.expires_at ?? "none"}</dd>
          </dl>
          <SandboxActions s={s} action={action} />
          <StatusLine action={action} />
          {s.state === "running" && <Terminal id={id} />}
          <div class="columns">
            {s.state === "running" && <FileBrowser id={id} />}
            <CommandHistory id={id} />
          </div>
        </>
      )}
      <TextTail title="Console log" load={() => consoleTail(id)} keyOf={id} />
      <AuditTable query={{ sandbox: id }} />
    </section>
  );
}
