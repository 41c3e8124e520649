/**
 * The idle timeout, the absolute deadline and the lifetime: the sweeper kills sandboxes past
 * their lifetime (running or paused), running ones past their deadline (in use or not) or idle
 * past their timeout (or pauses them, as asked), and forgets exited ones after a while;
 * setIdleTimeout() and setDeadline() change them.
 */
import { ForkdError, errorMessage } from "../util/index.js";
import type { SandboxContext } from "./context.js";
import { pause } from "./pause.js";
import { saveRecord } from "./record.js";
import { retire } from "./retire.js";
import { deadlineOf, endsAt, expiresAt } from "./sandbox.js";
import type { Sandbox } from "./sandbox.js";

/** Exited sandboxes stay listed (with why they exited) this long. */
const EXITED_RETENTION_MS = 10 * 60_000;
const SWEEP_MS = 1_000;

export class Sweeper {
  private timer: NodeJS.Timeout | null;
  /** Sandboxes whose idle or lifetime action is running: each is acted on once, on its own. */
  private readonly acting = new Set<string>();

  constructor(private readonly ctx: SandboxContext) {
    this.timer = setInterval(() => this.sweep(), SWEEP_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /**
   * One pass over the registry. Each due action runs apart from the pass and from the others
   * (an idle pause takes seconds; it never holds up another sandbox's lifetime), and its failure
   * is logged, never thrown into the timer.
   */
  private sweep(): void {
    const ctx = this.ctx;
    const now = Date.now();
    for (const s of ctx.live.list()) {
      const id = s.record.id;
      if (this.acting.has(id)) continue;
      const at = expiresAt(s);
      const end = endsAt(s);
      const deadline = deadlineOf(s);
      if (end !== null && now >= end && s.state !== "exited" && s.transition === null) {
        const ms = s.record.limits?.lifetimeMs ?? 0;
        ctx.log.info("sandbox lifetime over", { id, lifetime_ms: ms });
        this.act(id, () => retire(s, `killed by the host: lifetime of ${ms / 1000} s over`, true));
      } else if (deadline !== null && now >= deadline && s.state === "running" && s.transition === null) {
        const action = s.record.onDeadline ?? "kill";
        ctx.log.info("sandbox deadline", { id, deadline: s.record.deadline, action });
        if (action === "pause") this.act(id, () => pauseAtDeadline(ctx, s));
        else this.act(id, () => retire(s, "timeout: its deadline came", true));
      } else if (at !== null && s.busy === 0 && s.transition === null && now >= at) {
        ctx.log.info("sandbox idle timeout", {
          id,
          timeout_ms: s.record.timeoutMs,
          action: s.record.onIdle ?? "kill",
        });
        if (s.record.onIdle === "pause") {
          this.act(id, () =>
            pause(ctx, id).then(
              () => undefined,
              async (e: unknown) => {
                ctx.log.warn("idle pause failed; killing", { id, error: errorMessage(e) });
                await retire(s, "idle timeout (pause failed)", true);
              },
            ),
          );
        } else this.act(id, () => retire(s, "idle timeout", true));
      } else if (s.state === "exited" && s.exitedAt !== null && now - s.exitedAt > EXITED_RETENTION_MS) {
        ctx.live.delete(id);
      }
    }
  }

  private act(id: string, fn: () => Promise<void>): void {
    this.acting.add(id);
    fn()
      .catch((e: unknown) => this.ctx.log.warn("sweeper action failed", { id, error: errorMessage(e) }))
      .finally(() => this.acting.delete(id));
  }
}

/**
 * The deadline's pause: the sandbox keeps its state, and its deadline is cleared by the pause's
 * own record write (pausedRecord: a resume sets a new one, or none); a pause that fails kills it.
 */
async function pauseAtDeadline(ctx: SandboxContext, s: Sandbox): Promise<void> {
  const id = s.record.id;
  try {
    await pause(ctx, id);
  } catch (e) {
    ctx.log.warn("deadline pause failed; killing", { id, error: errorMessage(e) });
    await retire(s, "timeout: its deadline came (pause failed)", true);
    return;
  }
}

/**
 * Sets (or with null clears) the absolute deadline of `id` (running or paused), `ms` from now;
 * persisted, so a restarted daemon keeps it.
 */
export async function setDeadline(ctx: SandboxContext, id: string, ms: number | null): Promise<Sandbox> {
  const s = ctx.live.get(id);
  if (s.state === "exited")
    throw new ForkdError("conflict", `sandbox ${id} has exited`, { id, state: s.state });
  s.record = { ...s.record, deadline: ms === null ? null : new Date(Date.now() + ms).toISOString() };
  await saveRecord(s.dir, s.record);
  return s;
}

/** Sets (or with null clears) the idle timeout of running `id`, counted from now; persisted. */
export async function setIdleTimeout(
  ctx: SandboxContext,
  id: string,
  timeoutMs: number | null,
): Promise<Sandbox> {
  const s = ctx.live.running(id);
  s.record = { ...s.record, timeoutMs };
  s.lastUsed = Date.now();
  await saveRecord(s.dir, s.record);
  return s;
}
