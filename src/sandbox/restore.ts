/**
 * Loading a snapshot's state into a VMM that waits for it (`-incoming defer`, its memory file
 * mapped): the device state, and whatever else a snapshot needs before its guest may run. The one
 * place a fork (and the pool, ahead of forks) restores a child, so how a snapshot's memory is
 * stored can change without touching them.
 */
import type { Snapshot } from "../snapshot/index.js";
import { ForkdError } from "../util/index.js";
import type { Vm } from "../vmm/index.js";
import type { SandboxContext } from "./context.js";

/**
 * Restores `snap` into `vm` (stopped, waiting for device state; its memory file mapped); the
 * guest stays stopped. A diff snapshot's child maps the base image (`files.memory`): the diff's
 * pages are written into its RAM first, before the device state is loaded (loading virtio
 * devices reads their rings from guest RAM, which must already be the snapshot's), and are
 * private pages of it from then on, so a branch of it captures a diff relative to the same base
 * image again.
 */
export async function restoreChild(ctx: SandboxContext, vm: Vm, snap: Snapshot): Promise<void> {
  if (snap.files.memoryDiff !== undefined) {
    if (!ctx.memsnap)
      throw new ForkdError("unavailable", "forking a diff snapshot needs native/memsnap/forkd-memsnap");
    await ctx.memsnap.inject(vm.pid, snap.files.memory, snap.files.memoryDiff);
  }
  await vm.restoreState(snap.files.vmstate);
}
