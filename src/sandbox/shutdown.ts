/** Daemon shutdown: leave the sandboxes running for the next daemon (detach), or kill them all. */
import type { SandboxContext } from "./context.js";
import { kill } from "./retire.js";

/** Drops the pool and every connection; the VMs run on for the next daemon to adopt. */
export async function detachAll(ctx: SandboxContext): Promise<void> {
  await ctx.pool.close();
  for (const s of ctx.live.list()) {
    s.agent?.close();
    s.vm?.detach();
  }
}

/** Kills the pool and every sandbox. */
export async function killAll(ctx: SandboxContext): Promise<void> {
  await ctx.pool.close();
  await Promise.all(ctx.live.ids().map((id) => kill(ctx, id).catch(() => undefined)));
}
