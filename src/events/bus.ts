/**
 * The core's event bus: what changed in the daemon's state, told as it happens by the code that
 * changes it (the sandbox registry and the snapshot store), never found by polling disk. A
 * listener is called synchronously, in order; one that throws hurts no other (its error is
 * swallowed: a listener must not break the change that emitted it).
 * Consumers (the SSE route: src/api/routes/events.ts) turn these into wire views.
 */
import type { SandboxEvent } from "../sandbox/index.js";
import type { SnapshotEvent } from "../snapshot/index.js";

/**
 * Every change told: a sandbox's (created, changed state, gone) and a snapshot tag's (created,
 * changed status, deleted). Each emitter defines its own events and is given a sink for them;
 * the bus, above both, carries the union.
 */
export type CoreEvent = SandboxEvent | SnapshotEvent;

export type CoreListener = (e: CoreEvent) => void;

/** What the emitting code is given: only the means to tell. */
export interface EventSink {
  emit(e: CoreEvent): void;
}

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
