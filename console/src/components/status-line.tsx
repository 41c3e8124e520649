/** The line under a form that says what its last action did (a polite live region). */
import type { Action } from "../lib/use-action";

export function StatusLine({ action }: { action: Action }) {
  return (
    <p class={action.error ? "status error" : "status"} role="status" aria-live="polite">
      {action.message ?? ""}
    </p>
  );
}
