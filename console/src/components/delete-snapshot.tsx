/** Deleting a snapshot: a dry run first shows what would go (tags, sandboxes in the way), then the real delete. */
import { useState } from "preact/hooks";
import { planDelete, removeSnapshot } from "../api/snapshots";
import type { DeletePlan } from "../api/types";
import { useAction } from "../lib/use-action";
import { StatusLine } from "./status-line";

const names = (xs: string[]) => (xs.length === 0 ? "none" : xs.join(", "));

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
            setPlan(await planDelete(tag, cascade));
            return "dry run: nothing removed yet";
          })
        }
      >
        Delete {tag}…
      </button>
      {plan && (
        <div class="plan" role="region" aria-label="What the delete would remove">
          <dl>
            <dt>Snapshots removed</dt>
            <dd>{names(plan.deletes)}</dd>
            <dt>Branches in the way</dt>
            <dd>{names(plan.dependents)}</dd>
            <dt>Sandboxes in the way</dt>
            <dd>{names(plan.sandboxes)}</dd>
            {plan.orphaned.length > 0 && (
              <>
                <dt>Made independent</dt>
                <dd>{names(plan.orphaned)}</dd>
              </>
            )}
          </dl>
          {plan.refused ? (
            <p class="status error">The delete would be refused: kill those sandboxes, or cascade, first.</p>
          ) : (
            <button
              type="button"
              class="danger"
              disabled={action.busy}
              onClick={() =>
                void action.run(`delete ${tag}`, async () => {
                  const r = await removeSnapshot(tag, cascade);
                  setPlan(null);
                  onDeleted();
                  return `deleted ${[r.deleted, ...(r.cascaded ?? [])].join(", ")}`;
                })
              }
            >
              Confirm delete
            </button>
          )}
        </div>
      )}
      <StatusLine action={action} />
    </div>
  );
}
