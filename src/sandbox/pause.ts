/**
 * PAUSE: a running sandbox's whole state (memory, devices, disk) is saved in its own directory
 * and its VMM stops, freeing the memory. resume() (resume.ts) brings it back with the same id,
 * files and processes, also after a daemon restart.
 *
 * Every instant is recoverable after kill -9 (recovery.ts): until the record is written the
 * VMM runs (paused) and is adopted as running; the record names the image (pending) before
 * the VMM stops, so a daemon that dies later finishes the image instead of losing it.
 */
import { mkdir, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { ForkdError, errorMessage } from "../util/index.js";
import type { Vm } from "../vmm/index.js";
import { memoryFileOf } from "./branch.js";
import type { MemoryDiffs } from "../vmm/index.js";
import type { SandboxContext } from "./context.js";
import { saveRecord } from "./record.js";
import { buildMemory, pausedRecord } from "./recovery.js";
import { retire } from "./retire.js";
import { markPaused, settled } from "./sandbox.js";
import type { PausedImage, Sandbox } from "./sandbox.js";
import { transit } from "./transition.js";

/** Pauses the running sandbox `id` (one transition at a time). */
export async function pause(ctx: SandboxContext, id: string): Promise<Sandbox> {
  const s = ctx.live.running(id);
  const memsnap = ctx.memsnap;
  if (!memsnap) throw new ForkdError("unavailable", "pausing needs native/memsnap/forkd-memsnap");
  return transit(s, "pause", () => pauseNow(ctx, s, s.vm, memsnap));
}

async function pauseNow(ctx: SandboxContext, s: Sandbox, vm: Vm, memsnap: MemoryDiffs): Promise<Sandbox> {
  const id = s.record.id;
  const snap = await ctx.store.get(s.record.tag);
  const base = memoryFileOf(s, snap);
  const dir = join(s.dir, `paused-${Date.now().toString(36)}`);
  const diff = join(dir, "memory.diff");
  const before = s.record;
  let stopped = false;
  try {
    await mkdir(dir, { mode: 0o700 });
    const capture = await memsnap.capture(vm.pid, base, diff);
    let disk: string;
    try {
      await vm.pause();
      await vm.saveDevicesState(join(dir, "vmstate"));
      await capture.go();
      disk = await vm.diskTop();
      await capture.written;
    } catch (e) {
      capture.kill();
      throw e;
    }
    ctx.crash("pause:saved");
    const image: PausedImage = {
      pausedAt: new Date().toISOString(),
      memory: join(dir, "memory"),
      vmstate: join(dir, "vmstate"),
      disk,
      machine: snap.meta.machine,
      nic: snap.meta.nic
        ? { ...snap.meta.nic, linkUp: (s.record.network?.mode ?? "none") !== "none" }
        : undefined,
      pending: { diff, base },
    };
    // Written ahead, before the VMM stops: the saved state is never only in this process.
    s.record = { ...s.record, paused: image };
    await saveRecord(s.dir, s.record);
    ctx.crash("pause:recorded");
    // Detached from here: its VMM quitting is not an exit (onExit only acts on the current vm).
    const plain: Sandbox = s;
    // Its commands run on in the saved guest: the resume's connection takes them over.
    s.commands.suspend();
    plain.agent?.close();
    plain.vm = null;
    plain.agent = null;
    stopped = true;
    await vm.stop(); // quit: flushes and closes its disk
    ctx.crash("pause:after-stop");
    // Nothing runs: its slot and relays go back; resume() sets a network up again.
    await plain.net?.release();
    plain.net = null;
    if (s.doomed !== null) throw new ForkdError("conflict", `sandbox ${id} was killed while being paused`);
    await buildMemory(memsnap, base, diff, image.memory);
    ctx.crash("pause:before-record");
    // Its slot is given back; the network it asked for (and its host ports) comes back on resume.
    s.record = pausedRecord(s.record, image);
    await saveRecord(s.dir, s.record);
    markPaused(s);
    // The previous paused image (if it was resumed from one) is no longer mapped by any VMM;
    // a branch still being finished may read it, so it goes once those settle.
    const old = before.memoryFile;
    if (old && old !== image.memory) {
      void settled(s)
        .then(() => rm(dirname(old), { recursive: true, force: true }))
        .catch(() => undefined);
    }
    ctx.log.info("sandbox paused", { id });
    return s;
  } catch (e) {
    if (stopped) {
      // It was stopped but its image not finished: it cannot come back.
      await vm.kill().catch(() => undefined);
      await retire(s, `pause failed: ${errorMessage(e)}`, false);
    } else {
      // Never stopped: it runs on as it was.
      await vm.resume().catch(() => undefined);
      await rm(dir, { recursive: true, force: true });
      if (s.record !== before) {
        s.record = before;
        await saveRecord(s.dir, before).catch((w: unknown) =>
          ctx.log.warn("pause: record not restored", { id, error: errorMessage(w) }),
        );
      }
    }
    throw e;
  }
}
