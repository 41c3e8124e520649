/** Deleting a snapshot: a dry run first shows what would go (cascaded branches, sandboxes), then the real delete. */
import { useState } from "preact/hooks";
import { removeSnapshot } from "../api/snapshots";
import type { DeletePlan } from "../api/snapshots";
import { useAction } from "../lib/use-action";
import { StatusLine } from "./status-line";

function planLines(plan: DeletePlan): string[] {
  return Object.entries(plan).map(
    ([k, v]) => `${k}: ${Array.isArray(v) ? (v.length === 0 ? "none" : v.join(", ")) : JSON.stringify(v)}`,
  );
}

export function DeleteSnapshot({ tag, onDeleted }: { tag: string; onDeleted: () => void }) {
  const [cascade, setCascade] = useState(false);
  const [plan, setPlan] = useState<DeletePlan | null>(null);
  const action = useAction();
  return (
    <div class="delete" aria-label={`Delete ${tag}`} role="group">
      <label>
        <input
          type="checkbox"
          checked={cascade}
          onChange={(e) => {
            setCascade(e.currentTarget.checked);
            setPlan(null);
          }}
        />
        with the branches stacked on it (cascade)
      </label>
      <button
        type="button"
        disabled={action.busy}
        onClick={() =>
          void action.run(`dry run of deleting ${tag}`, async () => {
            setPlan(await removeSnapshot(tag, { cascade, dryRun: true }));
            return "dry run: nothing removed yet";
          })
        }
      >
        Delete {tag}…
      </button>
      {plan && (
        <div class="plan" role="region" aria-label="What the delete would remove">
          <ul>
            {planLines(plan).map((l) => (
              <li key={l}>{l}</li>
            ))}
          </ul>
          <button
            type="button"
            class="danger"
            disabled={action.busy}
            onClick={() =>
              void action.run(`delete ${tag}`, async () => {
                await removeSnapshot(tag, { cascade, dryRun: false });
                setPlan(null);
                onDeleted();
                return `deleted ${tag}`;
              })
            }
          >
            Confirm delete
          </button>
        </div>
      )}
      <StatusLine action={action} />
    </div>
  );
}
