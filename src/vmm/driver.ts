/**
 * What starts VMs: the sandbox and snapshot services depend on this, not on QEMU (qemu.ts is
 * one implementation; test/fakes/vmm.ts another; test/contract/vmm.ts the contract of both).
 */
import type { VmLaunch } from "./config.js";
import type { Vm, VmIdentity } from "./vm.js";

export interface LaunchOptions {
  /** How long the VMM may take to come up (default 10 s). */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** Another build of the VMM (e.g. one with user-mode networking). */
  binary?: string;
}

export interface VmmDriver {
  /** The VMM executable (strays of a dead daemon are found by it). */
  readonly binary: string;
  /**
   * Starts a VM. With `incoming` it waits for state (restoreState) and stays paused after it
   * loads: the caller connects the agent, then resumes. Fails (`vmm_error`) if it does not come up.
   */
  launch(l: VmLaunch, opts?: LaunchOptions): Promise<Vm>;
  /** Re-adopts a VM started by an earlier daemon, if it is still the same process (else null). */
  adopt(id: VmIdentity, dir: string): Promise<Vm | null>;
  /** The end of the VM's console output in `dir` ("" if none). */
  consoleTail(dir: string, bytes: number): Promise<string>;
}
