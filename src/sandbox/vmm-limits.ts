/** What a sandbox's VMM may use on the host: its cgroup's limits, and what its jail lets it read. */
import type { VmLimits } from "../host/cgroups.js";
import type { Snapshot } from "../snapshot/store.js";
import type { SandboxContext } from "./context.js";
import type { SandboxLimits } from "./sandbox.js";

/** Threads of one VMM process (QEMU: vCPUs, its I/O thread pool of up to 64, a few more). */
const VMM_TASKS = 256;

/**
 * The VMM cgroup's limits for a sandbox: its memory (default guest RAM + 384 MiB: all of its
 * RAM written, QEMU itself and its translation cache), a CPU quota if asked, and VMM_TASKS.
 */
export function limitsFor(machine: { memoryMiB: number }, asked: SandboxLimits = {}): VmLimits {
  const l: VmLimits = { memoryMiB: asked.memoryMiB ?? machine.memoryMiB + 384, pids: VMM_TASKS };
  if (asked.cpus !== undefined && asked.cpus !== null) l.cpus = asked.cpus;
  return l;
}

/** What a VM of `snap` may see in its jail: its snapshot chain and its guest image (read-only). */
export async function jailFor(
  ctx: SandboxContext,
  snap: Snapshot,
  limits: VmLimits,
): Promise<{ reads: string[]; limits: VmLimits }> {
  return { reads: [...(await ctx.store.chainDirs(snap)), snap.meta.image.dir], limits };
}
