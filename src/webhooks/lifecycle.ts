/**
 * Sandbox lifecycle events, read off the daemon's event bus (src/events/bus.ts): the bus tells
 * states (a sandbox listed, changed, gone; a snapshot written); this turns them into what
 * happened: created (first listed), paused, resumed (paused, then running), killed (a client's
 * DELETE), exited (ended by the host or itself: a timeout, its lifetime, its VMM's exit; with the
 * reason), branched (a branch of it is ready as a snapshot). Sandboxes already there when it
 * starts (re-adopted at a restart) are known, not told created.
 */
import type { CoreEvent } from "../events/index.js";
import type { ReadonlySandbox } from "../sandbox/index.js";
import { SANDBOX_ID_RE } from "../util/index.js";

export const LIFECYCLE_EVENTS = ["created", "paused", "resumed", "killed", "exited", "branched"] as const;
export type LifecycleType = (typeof LIFECYCLE_EVENTS)[number];

export interface LifecycleEvent {
  type: LifecycleType;
  sandboxId: string;
  /** The sandbox's tenant (null: an admin's). */
  owner: string | null;
  /** The snapshot key it was forked from (null: not known any more, e.g. after it was forgotten). */
  tag: string | null;
  metadata: Record<string, string>;
  /** killed, exited: why. */
  exitReason?: string;
  /** branched: the snapshot key made. */
  snapshot?: string;
  /** When it happened (ms since the epoch). */
  at: number;
}

interface Known {
  state: string;
  owner: string | null;
  tag: string | null;
  metadata: Record<string, string>;
}

/** At most this many branches followed at once (a branch's events come seconds apart). */
const MAX_BRANCHES = 10_000;

export class LifecycleTracker {
  private readonly known = new Map<string, Known>();
  /** Branches being written: snapshot key -> its sandbox. */
  private readonly branching = new Map<string, Known & { id: string }>();

  constructor(
    /** Whether snapshot `tag` is published now (a branch's end: ready, or failed). */
    private readonly isReady: (tag: string) => Promise<boolean>,
    private readonly emit: (e: LifecycleEvent) => void,
    private readonly now: () => number = Date.now,
  ) {}

  /** Knows `list` (the sandboxes there at start) without telling anything of them. */
  seed(list: readonly ReadonlySandbox[]): void {
    for (const s of list) this.known.set(s.record.id, this.knownOf(s));
  }

  private knownOf(s: ReadonlySandbox): Known {
    return {
      state: s.state,
      owner: s.record.owner ?? null,
      tag: s.record.tag,
      metadata: { ...(s.record.metadata ?? {}) },
    };
  }

  private tell(type: LifecycleType, id: string, k: Known, extra: Partial<LifecycleEvent> = {}): void {
    this.emit({
      type,
      sandboxId: id,
      owner: k.owner,
      tag: k.tag,
      metadata: k.metadata,
      at: this.now(),
      ...extra,
    });
  }

  /** Called for every bus event, synchronously. */
  onEvent(e: CoreEvent): void {
    switch (e.type) {
      case "sandbox": {
        const s = e.sandbox;
        const id = s.record.id;
        const prev = this.known.get(id);
        const now = this.knownOf(s);
        this.known.set(id, now);
        if (!prev) {
          if (s.state !== "exited") this.tell("created", id, now);
          return;
        }
        if (prev.state === now.state) return;
        if (now.state === "paused") this.tell("paused", id, now);
        else if (now.state === "running" && prev.state === "paused") this.tell("resumed", id, now);
        else if (now.state === "exited") {
          const reason = s.exitReason ?? "exited";
          this.tell(reason === "killed" ? "killed" : "exited", id, now, { exitReason: reason });
        }
        return;
      }
      case "sandbox-gone": {
        const prev = this.known.get(e.id);
        this.known.delete(e.id);
        // An exited one forgotten was told when it exited.
        if (prev && prev.state === "exited") return;
        const k = prev ?? { state: "gone", owner: e.owner, tag: null, metadata: {} };
        this.tell("killed", e.id, k, { exitReason: e.exitReason ?? "killed" });
        return;
      }
      case "snapshot": {
        const w = e.writing;
        if (w) {
          // A branch's start: its source is the sandbox branched (other creations name none, or no sandbox).
          const k = w.source !== null && SANDBOX_ID_RE.test(w.source) ? this.known.get(w.source) : undefined;
          if (k && w.source !== null && this.branching.size < MAX_BRANCHES)
            this.branching.set(e.tag, { ...k, id: w.source });
          return;
        }
        const b = this.branching.get(e.tag);
        if (!b) return;
        this.branching.delete(e.tag);
        this.isReady(e.tag).then(
          (ready) => {
            if (ready) this.tell("branched", b.id, b, { snapshot: e.tag });
          },
          () => undefined,
        );
        return;
      }
      default:
        return;
    }
  }
}
