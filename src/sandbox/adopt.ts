/**
 * After a daemon restart (recover): re-adopt every sandbox whose VMM is still the process we
 * started (or that is paused), finish what the dead daemon left mid-way (recovery.ts), and
 * clean up the rest: a directory without a record (a fork not finished) is removed with
 * whatever VMM still uses it; a record that does not parse is quarantined with a log line.
 */
import { mkdir, readdir, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { AgentClient } from "../agent/index.js";
import { errorMessage } from "../util/index.js";
import { SANDBOX_ID_RE } from "../util/index.js";
import type { StrayProcess } from "../vmm/index.js";
import type { SandboxContext } from "./context.js";
import { armDiskLimit } from "./disk-limit.js";
import { loadRecord, saveRecord } from "./record.js";
import {
  FANOUT_PREFIX,
  fanoutJournal,
  finishPause,
  strayImages,
  unclaimedRecord,
  unpausedRecord,
} from "./recovery.js";
import { register } from "./register.js";
import { markExited, markPaused } from "./sandbox.js";
import type { Sandbox, SandboxRecord } from "./sandbox.js";

export interface Recovered {
  adopted: string[];
  removed: string[];
  quarantined: string[];
}

/** Adopts, finishes or cleans up every sandbox directory under the root (see above). */
export async function recover(ctx: SandboxContext): Promise<Recovered> {
  const adopted: string[] = [];
  const removed: string[] = [];
  const quarantined: string[] = [];
  await mkdir(ctx.root, { recursive: true, mode: 0o700 });
  const names = await readdir(ctx.root);
  const journals = new Set(
    names.filter((n) => n.startsWith(FANOUT_PREFIX)).map((n) => n.slice(FANOUT_PREFIX.length)),
  );
  // One look at /proc: nothing of this daemon's runs yet.
  const procs = await ctx.strays.list();
  for (const name of names) {
    const dir = join(ctx.root, name);
    if (!SANDBOX_ID_RE.test(name)) continue;
    const loaded = await loadRecord(dir, name);
    if (loaded.kind !== "ok") {
      // A VMM may still run without a usable record (the daemon died before writing it).
      await ctx.strays.kill([`${dir}/`], "a sandbox without a usable record", procs);
      if (loaded.kind === "missing") {
        ctx.log.warn("recover: removing a sandbox whose creation did not finish", { id: name });
        await rm(dir, { recursive: true, force: true });
        removed.push(name);
      } else {
        await ctx.quarantine.keep(dir, "sandbox", loaded.reason);
        quarantined.push(name);
      }
      continue;
    }
    const record = loaded.record;
    try {
      await adoptOne(ctx, dir, record, journals, procs);
      adopted.push(name);
    } catch (e) {
      // Registered before a later step failed: forgotten again, its connections closed.
      const half = ctx.live.find(name);
      if (half) {
        ctx.live.delete(name);
        markExited(half, "not adopted"); // its VMM's end below is not an exit to act on
        half.agent?.close();
        half.vm?.detach();
        await half.net?.release();
      }
      await ctx.strays.kill([`${dir}/`], "a sandbox that cannot be adopted", procs);
      if (record.paused) {
        // Its saved state is someone's work: kept aside, not deleted.
        await ctx.quarantine.keep(dir, "sandbox", `paused state unusable: ${errorMessage(e)}`);
        quarantined.push(name);
      } else {
        ctx.log.warn("recover: removing sandbox", { id: name, reason: errorMessage(e) });
        await rm(dir, { recursive: true, force: true });
        removed.push(name);
      }
    }
  }
  for (const j of journals) await rm(fanoutJournal(ctx.root, j), { force: true });
  return { adopted, removed, quarantined };
}

/** Adopts one sandbox with a parsed record (see recover()); throws when it cannot. */
async function adoptOne(
  ctx: SandboxContext,
  dir: string,
  found: SandboxRecord,
  journals: Set<string>,
  procs: StrayProcess[],
): Promise<void> {
  const id = found.id;
  let record = found;
  let dirty = false;
  if (record.fanout !== undefined && journals.has(record.fanout)) {
    // Its fork's reply was never sent: nobody may know its id.
    record = unclaimedRecord(record);
    dirty = true;
    ctx.log.warn("recover: adopting a sandbox whose fork reply was never sent", {
      id,
      idle_timeout_ms: record.timeoutMs,
    });
  }
  if (record.paused?.pending) {
    // A pause cut short: undone if its VMM still runs, else finished from what it saved.
    const running = unpausedRecord(record);
    const s = await adoptRunning(ctx, dir, running).catch((e: unknown) => {
      ctx.log.warn("recover: finishing a pause its daemon did not", { id, reason: errorMessage(e) });
      return null;
    });
    if (s) {
      await saveRecord(dir, running);
      await rm(dirname(record.paused.memory), { recursive: true, force: true });
      ctx.log.info("recover: a pause cut short was undone; the sandbox runs", { id });
      return;
    }
    await ctx.strays.kill([`${dir}/`], "the VMM of a pause cut short", procs);
    const old = record.memoryFile;
    record = await finishPause(ctx.memsnap, record);
    await saveRecord(dir, record);
    dirty = false;
    if (old && old !== record.paused?.memory) await rm(dirname(old), { recursive: true, force: true });
  }
  if (record.paused) {
    // Nothing may run from its files: a resume cut short left a VMM whose guest never ran.
    await ctx.strays.kill([`${dir}/`], "the VMM of a resume cut short", procs);
    if (dirty) await saveRecord(dir, record);
    markPaused(register(ctx, record, dir, null, null, null));
  } else {
    await adoptRunning(ctx, dir, record);
    if (dirty) await saveRecord(dir, record);
  }
  for (const stray of await strayImages(dir, record)) await rm(stray, { recursive: true, force: true });
}

/**
 * Re-adopts the running VMM `record` names: reconnects its agent, resumes a guest a dead
 * daemon left paused (mid-pause, mid-branch, or resumed but not yet continued), takes its
 * network back. Registers it only once all of that worked.
 */
async function adoptRunning(ctx: SandboxContext, dir: string, record: SandboxRecord): Promise<Sandbox> {
  const id = record.id;
  const vm = await ctx.driver.adopt({ pid: record.pid, startTime: record.pidStartTime }, dir);
  if (!vm) throw new Error("VMM process is gone");
  let agent: AgentClient | null = null;
  try {
    agent = await vm.connectAgent(15_000);
    // A live branch it left mid-way (src/vmm/live-capture.ts): QEMU resumes a guest it stopped.
    await vm.migrationCancel(15_000);
    // Stopped by a pause or branch ("postmigrate": a live branch's capture was complete).
    if (["paused", "postmigrate"].includes(await vm.status())) {
      await vm.resume();
      await agent.identity({ hostname: id, sandboxId: id }, 15_000);
      ctx.log.info("recover: resumed a guest its daemon left paused", { id });
    } else await agent.ping(15_000);
  } catch (e) {
    agent?.close();
    vm.detach();
    throw e;
  }
  const net = record.network ? ctx.net.adopt(record.network) : null;
  const s = register(ctx, record, dir, vm, agent, net);
  // The commands its guest runs (the dead daemon's) are tracked again: the handover found them.
  s.commands.adopt(await agent.inherited(15_000));
  // The threshold still holds in QEMU, but one crossed while no daemon listened went unheard.
  await armDiskLimit(ctx, s).catch((e: unknown) =>
    ctx.log.warn("recover: disk limit not armed", { id, error: errorMessage(e) }),
  );
  await net
    ?.start()
    .catch((e: unknown) =>
      ctx.log.warn("recover: exposed ports not relayed", { id, error: errorMessage(e) }),
    );
  return s;
}
