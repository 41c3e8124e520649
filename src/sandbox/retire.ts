/**
 * Ending sandboxes: retire() stops one for a reason and frees its VMM, network and files (it
 * stays listed as exited for a while); kill() is a client's DELETE, which also forgets it.
 */
import { rm } from "node:fs/promises";
import { ForkdError } from "../util/index.js";
import type { SandboxContext } from "./context.js";
import { markExited, settled } from "./sandbox.js";
import type { Sandbox } from "./sandbox.js";

/** How long DELETE waits for a pause, resume or branch in progress before it answers. */
const KILL_WAIT_MS = 60_000;

/** Stops `s` for `reason` (`kill`: its VMM too), frees its VMM and files; it stays listed as exited. */
export async function retire(s: Sandbox, reason: string, kill: boolean): Promise<void> {
  if (!markExited(s, reason)) return;
  // Its commands end with it (also those suspended while it was paused).
  s.commands.lose(
    new ForkdError("unavailable", `sandbox ${s.record.id} exited: ${reason}`, {
      id: s.record.id,
      exit_reason: reason,
    }),
  );
  s.agent?.close();
  if (kill) await s.vm?.kill().catch(() => undefined);
  // Its VMM is gone: its slot can go to another child.
  await s.net?.release();
  s.net = null;
  // Its files go once any branch of it still being finished has read them.
  if (s.finishing.size > 0)
    void settled(s)
      .then(() => rm(s.dir, { recursive: true, force: true }))
      .catch(() => undefined);
  else await rm(s.dir, { recursive: true, force: true });
}

/**
 * Kills a sandbox asked to die (running, paused or already exited) and forgets it. During a
 * pause, resume or branch it is marked doomed and that transition's end retires it; this waits
 * for that (at most KILL_WAIT_MS), so the sandbox's files are gone when it returns.
 */
export async function kill(ctx: SandboxContext, id: string): Promise<void> {
  const s = ctx.live.get(id);
  ctx.live.delete(id);
  if (s.settling) {
    s.doomed = "killed";
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([s.settling, new Promise<void>((r) => (timer = setTimeout(r, KILL_WAIT_MS)))]);
    clearTimeout(timer);
    if (s.transition !== null) {
      ctx.log.warn("kill: the transition in progress retires the sandbox when it ends", {
        id,
        transition: s.transition,
      });
      return;
    }
  }
  await retire(s, "killed", true);
}
