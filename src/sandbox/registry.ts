/**
 * The live registry: every sandbox the daemon holds (running, paused, and exited ones still
 * listed), and the children being forked right now, counted against the daemon's limit. What
 * enters, changes state in (sandbox.ts's mark*) and leaves it is told to the sink it is given
 * (the event bus: src/events/bus.ts, which knows these events; the registry knows no bus).
 */
import { ForkdError } from "../util/index.js";
import { assertSandboxId } from "../util/index.js";
import type { AgentClient } from "../agent/index.js";
import type { Vm } from "../vmm/index.js";
import type { ReadonlySandbox, Sandbox } from "./sandbox.js";

/** What the registry tells (src/events/bus.ts carries it to listeners: its CoreEvent). */
export type SandboxEvent =
  /** A sandbox was created, or its state changed (running, paused, exited). */
  | { type: "sandbox"; sandbox: ReadonlySandbox }
  /** A sandbox is no longer listed (killed, or an exited one forgotten). */
  | { type: "sandbox-gone"; id: string; exitReason: string | null; owner: string | null }
  /** The warm pool's members of snapshot `tag` that are ready now changed (to `ready`). */
  | { type: "pool"; tag: string; ready: number };

/** Where the registry tells it: the daemon's event bus, or nowhere. */
export interface SandboxEventSink {
  emit(e: SandboxEvent): void;
}

export class SandboxRegistry {
  private readonly live = new Map<string, Sandbox>();
  /** Children being forked right now, in all and by tag. */
  private startingAll = 0;
  private readonly startingByTag = new Map<string, number>();

  /** Sandboxes held plus children being forked: what the daemon's limit counts. */
  get held(): number {
    return this.live.size + this.startingAll;
  }

  constructor(private readonly events: SandboxEventSink = { emit: () => undefined }) {}

  add(s: Sandbox): void {
    this.live.set(s.record.id, s);
    // Only while listed: a killed sandbox's retirement is told by its `sandbox-gone`.
    s.changed = () => {
      if (this.live.get(s.record.id) === s) this.events.emit({ type: "sandbox", sandbox: s });
    };
    this.events.emit({ type: "sandbox", sandbox: s });
  }

  delete(id: string): void {
    const s = this.live.get(id);
    if (!s) return;
    this.live.delete(id);
    this.events.emit({
      type: "sandbox-gone",
      id,
      exitReason: s.exitReason ?? "killed",
      owner: s.record.owner ?? null,
    });
  }

  /** The sandbox `id`, or null (no check of the id's form). */
  find(id: string): Sandbox | null {
    return this.live.get(id) ?? null;
  }

  /** The sandbox `id` (a malformed id is invalid_argument, an unknown one not_found). */
  get(id: string): Sandbox {
    assertSandboxId(id);
    const s = this.live.get(id);
    if (!s) throw new ForkdError("not_found", `no sandbox ${id}`, { id });
    return s;
  }

  /** The sandbox `id` if it runs now (else a conflict saying why not). */
  running(id: string): Sandbox & { vm: Vm; agent: AgentClient } {
    const s = this.get(id);
    if (s.state !== "running" || !s.vm || !s.agent) {
      const why =
        s.transition === "pause"
          ? "being paused"
          : s.state === "paused"
            ? "paused; resume it first"
            : (s.exitReason ?? s.state);
      throw new ForkdError("conflict", `sandbox ${id} is not running (${why})`, { id, state: s.state });
    }
    return s as Sandbox & { vm: Vm; agent: AgentClient };
  }

  /** Every sandbox held, oldest first. */
  list(): Sandbox[] {
    return [...this.live.values()].sort((a, b) => a.record.created.localeCompare(b.record.created));
  }

  ids(): string[] {
    return [...this.live.keys()];
  }

  /** Counts `n` children of `tag` as being forked until the returned function is called (once). */
  starting(tag: string, n: number): () => void {
    this.startingAll += n;
    this.startingByTag.set(tag, (this.startingByTag.get(tag) ?? 0) + n);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.startingAll -= n;
      const left = (this.startingByTag.get(tag) ?? n) - n;
      if (left > 0) this.startingByTag.set(tag, left);
      else this.startingByTag.delete(tag);
    };
  }

  /** Sandboxes of `tag` holding its files (running or paused) plus children of it being forked. */
  countByTag(tag: string): number {
    let n = this.startingByTag.get(tag) ?? 0;
    // A paused sandbox's disk still stacks on its snapshot's.
    for (const s of this.live.values()) if (s.record.tag === tag && s.state !== "exited") n++;
    return n;
  }
}
