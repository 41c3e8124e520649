/**
 * Loading a snapshot's state into a VMM that waits for it (`-incoming defer`, its memory file
 * mapped): the device state, and whatever else a snapshot needs before its guest may run. The one
 * place a fork (and the pool, ahead of forks) restores a child, so how a snapshot's memory is
 * stored can change without touching them.
 */
import type { Snapshot } from "../snapshot/store.js";
import type { Vm } from "../vmm/vm.js";
import type { SandboxContext } from "./context.js";

/** Restores `snap` into `vm` (stopped, waiting for device state); the guest stays stopped. */
export async function restoreChild(_ctx: SandboxContext, vm: Vm, snap: Snapshot): Promise<void> {
  await vm.restoreState(snap.files.vmstate);
}
