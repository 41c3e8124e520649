/** The selected snapshot: its status, chain and size on disk, its sandboxes, fork N from it, delete it. */
import { fork } from "../api/sandboxes";
import { info } from "../api/snapshots";
import type { Sandbox, SnapshotView } from "../api/types";
import { bytes } from "../lib/format";
import { hrefOf } from "../lib/route";
import { useAction } from "../lib/use-action";
import { usePoll } from "../lib/use-poll";
import { DeleteSnapshot } from "./delete-snapshot";
import { InlineForm } from "./inline-form";
import { StatusLine } from "./status-line";

export function SnapshotPanel(p: { s: SnapshotView; sandboxes: Sandbox[]; onDeleted: () => void }) {
  const { s } = p;
  const ready = s.status === "ready";
  const chain = usePoll(() => (ready ? info(s.tag) : Promise.resolve(undefined)), 0, `${s.tag}:${s.status}`);
  const action = useAction();
  const i = chain.value;
  return (
    <section class="panel" aria-label={`Snapshot ${s.tag}`}>
      <h2>{s.tag}</h2>
      <dl>
        <dt>Status</dt>
        <dd>{s.status}</dd>
        {s.status === "ready" ? (
          <>
            <dt>Created</dt>
            <dd>{s.created}</dd>
            <dt>Parent</dt>
            <dd>{s.parent?.tag ?? "none (a base)"}</dd>
            {s.memory_base && (
              <>
                <dt>Memory base</dt>
                <dd>{s.memory_base.tag}</dd>
              </>
            )}
            <dt>Machine</dt>
            <dd>
              {s.machine.vcpus} vCPU, {s.machine.memory_mib} MiB, {s.machine.accel}
            </dd>
            {s.branch && (
              <>
                <dt>Branched from</dt>
                <dd>
                  {s.branch.sandbox} (paused {Math.round(s.branch.pause_ms)} ms)
                </dd>
              </>
            )}
          </>
        ) : (
          <>
            <dt>Started</dt>
            <dd>{s.started}</dd>
            {s.error && (
              <>
                <dt>Error</dt>
                <dd>{s.error.message}</dd>
              </>
            )}
          </>
        )}
        {i && (
          <>
            <dt>Depth</dt>
            <dd>{i.depth}</dd>
            <dt>Size on disk</dt>
            <dd>{bytes(i.physical_bytes)}</dd>
            <dt>Logical size</dt>
            <dd>{bytes(i.logical_bytes)}</dd>
            <dt>Dependents</dt>
            <dd>{i.dependents.length === 0 ? "none" : i.dependents.join(", ")}</dd>
          </>
        )}
        <dt>Sandboxes</dt>
        <dd>
          {p.sandboxes.length === 0
            ? "none"
            : p.sandboxes.map((x) => (
                <a key={x.id} class="chip" href={hrefOf({ page: "sandbox", id: x.id })}>
                  {x.id}
                </a>
              ))}
        </dd>
      </dl>
      {chain.error && <p class="status error">{chain.error}</p>}
      {ready && (
        <InlineForm
          label={`Fork from ${s.tag}`}
          field="Number of sandboxes"
          type="number"
          initial="1"
          submit="Fork"
          disabled={action.busy}
          onSubmit={(v) =>
            void action.run(`fork ${v} from ${s.tag}`, async () => {
              const r = await fork(s.tag, Math.max(1, Math.floor(Number(v) || 1)));
              const failed = r.failures.length === 0 ? "" : `, ${r.failures.length} failed`;
              return `forked ${r.sandboxes.map((x) => x.id).join(", ")}${failed}`;
            })
          }
        />
      )}
      <StatusLine action={action} />
      <DeleteSnapshot tag={s.tag} onDeleted={p.onDeleted} />
    </section>
  );
}
