/**
 * The core's event bus: what changed in the daemon's state, told as it happens by the code that
 * changes it (the sandbox registry and the snapshot store), never found by polling disk. A
 * listener is called synchronously, in order; one that throws hurts no other (its error is
 * swallowed: a listener must not break the change that emitted it).
 * Consumers (the SSE route: src/api/routes/events.ts) turn these into wire views.
 */
import type { ReadonlySandbox } from "../sandbox/sandbox.js";
import type { SnapshotPending } from "../snapshot/store.js";

export type CoreEvent =
  /** A sandbox was created, or its state changed (running, paused, exited). */
  | { type: "sandbox"; sandbox: ReadonlySandbox }
  /** A sandbox is no longer listed (killed, or an exited one forgotten). */
  | { type: "sandbox-gone"; id: string; exitReason: string | null; owner: string | null }
  /**
   * A snapshot tag was created or changed status (writing, ready, failed). `writing`: the status
   * at the change, for one that may end before a consumer reads it (a creation that fails at once).
   */
  | { type: "snapshot"; tag: string; writing?: SnapshotPending }
  /** A snapshot tag (ready or failed) was deleted. */
  | { type: "snapshot-gone"; tag: string };

export type CoreListener = (e: CoreEvent) => void;

/** What the emitting code is given: only the means to tell. */
export interface EventSink {
  emit(e: CoreEvent): void;
}

export const NO_EVENTS: EventSink = { emit: () => undefined };

export class EventBus implements EventSink {
  private readonly listeners = new Set<CoreListener>();

  /** Calls `l` for every event from now on, until the returned function is called. */
  subscribe(l: CoreListener): () => void {
    this.listeners.add(l);
    return () => void this.listeners.delete(l);
  }

  emit(e: CoreEvent): void {
    for (const l of [...this.listeners]) {
      try {
        l(e);
      } catch {
        // A listener's failure is its own (see the header).
      }
    }
  }

  get size(): number {
    return this.listeners.size;
  }
}
