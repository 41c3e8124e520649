/** What a sandbox's VMM may see in its jail (its limits: src/vmm/limits.ts). */
import type { VmLimits } from "../host/index.js";
import type { Snapshot } from "../snapshot/index.js";
import type { SandboxContext } from "./context.js";

/** What a VM of `snap` may see in its jail: its snapshot chain and its guest image (read-only). */
export async function jailFor(
  ctx: SandboxContext,
  snap: Snapshot,
  limits: VmLimits,
): Promise<{ reads: string[]; limits: VmLimits }> {
  return { reads: [...(await ctx.store.chainDirs(snap)), snap.meta.image.dir], limits };
}
