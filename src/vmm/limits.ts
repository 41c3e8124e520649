/** What one VMM process may use on the host by default: its cgroup's limits (src/host/cgroups.ts). */
import type { VmLimits } from "../host/index.js";

/** Threads of one VMM process (QEMU: vCPUs, its I/O thread pool of up to 64, a few more). */
const VMM_TASKS = 256;

/** What a caller may ask for instead of the defaults. */
export interface AskedLimits {
  memoryMiB?: number | null | undefined;
  cpus?: number | null | undefined;
}

/**
 * The VMM cgroup's limits for a VM of `machine` (a sandbox's, a parent's): its memory (default
 * guest RAM + 384 MiB: all of its RAM written, QEMU itself and its translation cache), a CPU
 * quota if asked, and VMM_TASKS.
 */
export function limitsFor(machine: { memoryMiB: number }, asked: AskedLimits = {}): VmLimits {
  const l: VmLimits = { memoryMiB: asked.memoryMiB ?? machine.memoryMiB + 384, pids: VMM_TASKS };
  if (asked.cpus !== undefined && asked.cpus !== null) l.cpus = asked.cpus;
  return l;
}
