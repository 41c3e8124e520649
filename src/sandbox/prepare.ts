/**
 * Starting a child's VMM: its own directory and disk layer over its snapshot's, QEMU with the
 * snapshot's memory mapped, waiting for device state (`-incoming defer`), and the agent socket
 * connected. Used by a fork, and by the warm pool ahead of forks (pool.ts).
 */
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { cloneOverlay } from "../disk/index.js";
import { guestNetOf } from "../net/index.js";
import type { Attachment } from "../net/index.js";
import type { Snapshot } from "../snapshot/index.js";
import { newSandboxId } from "../util/index.js";
import { nowMs, since } from "../util/index.js";
import type { Vm } from "../vmm/index.js";
import type { SandboxContext } from "./context.js";
import type { Prepared } from "./pool.js";
import { limitsFor } from "../vmm/index.js";
import { jailFor } from "./jail-reads.js";

/**
 * Starts a VMM for a child of `snap`, waiting for device state (for the pool `net` is absent,
 * and a NIC gets no connectivity). Nothing is left behind when it fails.
 */
export async function prepare(ctx: SandboxContext, snap: Snapshot, net?: Attachment): Promise<Prepared> {
  const id = newSandboxId();
  const dir = join(ctx.root, id);
  const t0 = nowMs();
  let vm: Vm | null = null;
  try {
    await mkdir(dir, { mode: 0o700 });
    const disk = join(dir, "disk.qcow2");
    await cloneOverlay(snap.files.childDisk, disk);
    vm = await ctx.driver.launch(
      {
        dir,
        machine: snap.meta.machine,
        memory: { path: snap.files.memory, mode: "child" },
        disk,
        incoming: true,
        tbSizeMiB: ctx.tbSizeMiB,
        devicesOnlyState: snap.meta.stateFormat === "devices",
        nic: snap.meta.nic
          ? { guest: guestNetOf(snap.meta.nic), backend: net?.backend ?? { kind: "none" } }
          : undefined,
        netns: net?.netns,
        jail: await jailFor(ctx, snap, limitsFor(snap.meta.machine)),
      },
      { binary: net?.binary },
    );
    // Connect to the agent before the guest runs, so it never sees its host end closed.
    const agent = await vm.connectAgent(10_000);
    return { id, dir, vm, agent, launchMs: since(t0), checksum: snap.meta.checksum };
  } catch (e) {
    await vm?.kill().catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
    throw e;
  }
}
