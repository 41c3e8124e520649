/** Where a snapshot hangs in the tree: a branch under its parent; one still being written under its source sandbox's snapshot. */
import type { Sandbox, SnapshotView } from "../api/types";

export function parentOf(s: SnapshotView, sandboxes: Record<string, Sandbox>): string | null {
  if (s.status === "ready") return s.parent?.tag ?? null;
  return s.source ? (sandboxes[s.source]?.tag ?? null) : null;
}
