/**
 * Where a snapshot hangs in the tree: a branch under its parent; one still being written under its
 * source sandbox's snapshot. And the memory base a diff snapshot maps, when it is not that parent.
 */
import type { Sandbox, SnapshotView } from "../api/types.js";

export function parentOf(s: SnapshotView, sandboxes: Record<string, Sandbox>): string | null {
  if (s.status === "ready") return s.parent?.tag ?? null;
  return s.source ? (sandboxes[s.source]?.tag ?? null) : null;
}

/** A diff snapshot's memory base (the full image its memory diff is relative to), when it is not its parent. */
export function memoryBaseOf(s: SnapshotView): string | null {
  if (s.status !== "ready" || !s.memory_base) return null;
  return s.memory_base.tag === s.parent?.tag ? null : s.memory_base.tag;
}
