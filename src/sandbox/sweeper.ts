/**
 * The idle timeout and the lifetime: the sweeper kills sandboxes past their lifetime (running
 * or paused) or idle past their timeout (or pauses them, as asked), and forgets exited ones
 * after a while; setIdleTimeout() changes a sandbox's timeout.
 */
import { errorMessage } from "../util/errors.js";
import type { SandboxContext } from "./context.js";
import { pause } from "./pause.js";
import { saveRecord } from "./record.js";
import { retire } from "./retire.js";
import { endsAt, expiresAt } from "./sandbox.js";
import type { Sandbox } from "./sandbox.js";

/** Exited sandboxes stay listed (with why they exited) this long. */
const EXITED_RETENTION_MS = 10 * 60_000;
const SWEEP_MS = 1_000;

export class Sweeper {
  private timer: NodeJS.Timeout | null;

  constructor(ctx: SandboxContext) {
    this.timer = setInterval(() => void sweep(ctx), SWEEP_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}

/** One pass over the registry (see Sweeper). */
export async function sweep(ctx: SandboxContext): Promise<void> {
  const now = Date.now();
  for (const s of ctx.live.list()) {
    const at = expiresAt(s);
    const end = endsAt(s);
    if (end !== null && now >= end && s.state !== "exited" && s.transition === null) {
      const ms = s.record.limits?.lifetimeMs ?? 0;
      ctx.log.info("sandbox lifetime over", { id: s.record.id, lifetime_ms: ms });
      await retire(s, `killed by the host: lifetime of ${ms / 1000} s over`, true);
    } else if (at !== null && s.busy === 0 && s.transition === null && now >= at) {
      ctx.log.info("sandbox idle timeout", {
        id: s.record.id,
        timeout_ms: s.record.timeoutMs,
        action: s.record.onIdle ?? "kill",
      });
      if (s.record.onIdle === "pause") {
        await pause(ctx, s.record.id).catch(async (e: unknown) => {
          ctx.log.warn("idle pause failed; killing", { id: s.record.id, error: errorMessage(e) });
          await retire(s, "idle timeout (pause failed)", true);
        });
      } else await retire(s, "idle timeout", true);
    } else if (s.state === "exited" && s.exitedAt !== null && now - s.exitedAt > EXITED_RETENTION_MS) {
      ctx.live.delete(s.record.id);
    }
  }
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
