/**
 * The live view of the daemon: sandboxes, snapshots and host usage, folded from the events of
 * GET /v1/events. Pure: each event gives a new state (`state` replaces everything).
 */
import type { Sandbox, SnapshotView, Usage } from "../api/types.js";

export interface LiveState {
  /** False until the first `state` event, and after the stream drops until the next one. */
  connected: boolean;
  sandboxes: Record<string, Sandbox>;
  snapshots: Record<string, SnapshotView>;
  usage: Record<string, Usage>;
}

export const EMPTY: LiveState = { connected: false, sandboxes: {}, snapshots: {}, usage: {} };

export type LiveEvent =
  | { type: "state"; data: { sandboxes: Sandbox[]; snapshots: SnapshotView[]; pending?: SnapshotView[] } }
  | { type: "sandbox"; data: Sandbox }
  | { type: "sandbox-gone"; data: { id: string; exit_reason: string | null } }
  | { type: "snapshot"; data: SnapshotView }
  | { type: "snapshot-gone"; data: { tag: string } }
  | { type: "usage"; data: { sandboxes: Record<string, Usage> } }
  | { type: "lost" };

function without<T>(rec: Record<string, T>, key: string): Record<string, T> {
  const next = { ...rec };
  delete next[key];
  return next;
}

export function applyEvent(s: LiveState, e: LiveEvent): LiveState {
  switch (e.type) {
    case "state":
      return {
        connected: true,
        sandboxes: Object.fromEntries(e.data.sandboxes.map((x) => [x.id, x])),
        // Those being written or failed, then the ready ones (a tag in both is ready).
        snapshots: Object.fromEntries(
          [...(e.data.pending ?? []), ...e.data.snapshots].map((x) => [x.tag, x]),
        ),
        usage: s.usage,
      };
    case "sandbox":
      return { ...s, sandboxes: { ...s.sandboxes, [e.data.id]: e.data } };
    case "sandbox-gone":
      return { ...s, sandboxes: without(s.sandboxes, e.data.id), usage: without(s.usage, e.data.id) };
    case "snapshot":
      return { ...s, snapshots: { ...s.snapshots, [e.data.tag]: e.data } };
    case "snapshot-gone":
      return { ...s, snapshots: without(s.snapshots, e.data.tag) };
    case "usage":
      return { ...s, usage: e.data.sandboxes };
    case "lost":
      return { ...s, connected: false };
  }
}
