/** A sandbox's actions: kill, pause or resume, branch (optionally named), and set its idle timeout. */
import * as sb from "../api/sandboxes";
import type { Sandbox } from "../api/types";
import type { Action } from "../lib/use-action";
import { InlineForm } from "./inline-form";

export function SandboxActions({ s, action }: { s: Sandbox; action: Action }) {
  const id = s.id;
  const running = s.state === "running";
  return (
    <div class="actions" role="group" aria-label={`Actions for ${id}`}>
      <button
        type="button"
        aria-label={`Kill ${id}`}
        disabled={action.busy}
        onClick={() => void action.run(`kill ${id}`, async () => sb.kill(id))}
      >
        Kill
      </button>
      {running ? (
        <button
          type="button"
          aria-label={`Pause ${id}`}
          disabled={action.busy}
          onClick={() => void action.run(`pause ${id}`, async () => sb.pause(id))}
        >
          Pause
        </button>
      ) : s.state === "paused" ? (
        <button
          type="button"
          aria-label={`Resume ${id}`}
          disabled={action.busy}
          onClick={() => void action.run(`resume ${id}`, async () => sb.resume(id))}
        >
          Resume
        </button>
      ) : null}
      {running && (
        <InlineForm
          label="Branch"
          field={`New snapshot tag for ${id} (empty: generated)`}
          placeholder="br-…"
          submit="Create branch"
          disabled={action.busy}
          onSubmit={(tag) =>
            void action.run(`branch ${id}`, async () => {
              const r = await sb.branch(id, tag || undefined);
              return `branched ${id} into ${r.tag} (${r.status}, paused ${Math.round(r.pause_ms)} ms)`;
            })
          }
        />
      )}
      <InlineForm
        label="Timeout"
        field={`Idle timeout in seconds for ${id} (empty: none)`}
        type="number"
        initial={s.timeout_ms === null ? "" : String(Math.round(s.timeout_ms / 1000))}
        submit="Set timeout"
        disabled={action.busy}
        onSubmit={(v) =>
          void action.run(`timeout ${id}`, async () =>
            sb.setTimeoutMs(id, v === "" ? null : Math.round(Number(v) * 1000)),
          )
        }
      />
    </div>
  );
}
