/**
 * A pool of pre-started VMMs per snapshot: QEMU already running with the snapshot's memory
 * mapped, its disk layer in place, QMP and the agent socket connected, waiting for device state
 * (`-incoming defer`). A fork that takes one skips process start-up and pays only restore,
 * resume and the first agent reply. Refilled in the background once a fork has finished.
 */
import { rm } from "node:fs/promises";
import type { AgentClient } from "../agent/client.js";
import { errorMessage } from "../util/errors.js";
import type { Vm } from "../vmm/vm.js";
import type { Logger } from "../util/log.js";

export interface Prepared {
  id: string;
  dir: string;
  vm: Vm;
  agent: AgentClient;
  launchMs: number;
}

export class WarmPool {
  private readonly ready = new Map<string, Prepared[]>();
  private readonly filling = new Set<string>();
  private closed = false;

  constructor(
    private readonly size: number,
    private readonly prepare: (tag: string) => Promise<Prepared>,
    private readonly log: Logger,
  ) {}

  /**
   * A pre-started VMM for `tag`, or null. Does not refill: the caller refills once its fork is
   * done, so starting replacements does not compete for the CPU with the fork itself.
   */
  take(tag: string): Prepared | null {
    if (this.size <= 0 || this.closed) return null;
    const list = this.ready.get(tag) ?? [];
    let p: Prepared | undefined;
    while ((p = list.shift()) && (p.vm.exited || p.agent.closed)) void discard(p);
    return p ?? null;
  }

  status(): Record<string, number> {
    return Object.fromEntries([...this.ready].map(([tag, list]) => [tag, list.length]));
  }

  /** Starts VMMs one at a time until `size` are ready for `tag`. */
  refill(tag: string): void {
    if (this.size <= 0 || this.closed || this.filling.has(tag)) return;
    this.filling.add(tag);
    void (async () => {
      try {
        while (!this.closed && (this.ready.get(tag)?.length ?? 0) < this.size) {
          const p = await this.prepare(tag);
          if (this.closed) {
            await discard(p);
            break;
          }
          const list = this.ready.get(tag) ?? [];
          list.push(p);
          this.ready.set(tag, list);
        }
      } catch (e) {
        this.log.warn("pool: could not pre-start a VMM", { tag, reason: errorMessage(e) });
      } finally {
        this.filling.delete(tag);
      }
    })();
  }

  /** Kills the pooled VMMs of `tag` (its snapshot is going away). */
  async drain(tag: string): Promise<void> {
    const list = this.ready.get(tag) ?? [];
    this.ready.delete(tag);
    await Promise.all(list.map(discard));
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.ready.keys()].map((t) => this.drain(t)));
  }
}

/** Ends a pre-started VMM that will serve no child: its agent connection, its process, its directory. */
export async function discard(p: Prepared): Promise<void> {
  p.agent.close();
  await p.vm.kill().catch(() => undefined);
  await rm(p.dir, { recursive: true, force: true });
}
