/**
 * RESUME: a paused sandbox runs again: same id, same files and processes, a corrected clock.
 * The record names the new VMM before its guest runs (the paused image is consistent with the
 * disk until then): a daemon that dies earlier kills that VMM and keeps the sandbox paused;
 * later, the next one adopts it as running.
 */
import { guestNetOf } from "../net/index.js";
import type { Attachment } from "../net/index.js";
import { NO_NETWORK } from "../net/index.js";
import type { NetworkSpec } from "../net/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import type { Vm } from "../vmm/index.js";
import type { SandboxContext } from "./context.js";
import { armDiskLimit } from "./disk-limit.js";
import { NET_UP_WAIT_MS } from "./fork.js";
import { saveRecord } from "./record.js";
import { watchAgent, watchVmm } from "./register.js";
import { retire } from "./retire.js";
import { markRunning } from "./sandbox.js";
import type { PausedImage, Sandbox, SandboxRecord } from "./sandbox.js";
import { notInTransition, transit } from "./transition.js";
import { limitsFor } from "../vmm/index.js";
import { jailFor } from "./jail-reads.js";

export interface ResumeOptions {
  /**
   * A new absolute deadline, this long from the resume, written in the same record as the resume
   * itself (E2B's connect/resume: a crash between two writes would leave it running with none).
   */
  deadlineMs?: number;
}

/** Resumes the paused sandbox `id` (one transition at a time). */
export async function resume(ctx: SandboxContext, id: string, opts: ResumeOptions = {}): Promise<Sandbox> {
  const s = ctx.live.get(id);
  notInTransition(s);
  const p = s.record.paused;
  if (s.state !== "paused" || !p) {
    throw new ForkdError("conflict", `sandbox ${id} is not paused (${s.state})`, { id, state: s.state });
  }
  return transit(s, "resume", () => resumeNow(ctx, s, p, opts));
}

async function resumeNow(
  ctx: SandboxContext,
  s: Sandbox,
  p: PausedImage,
  opts: ResumeOptions,
): Promise<Sandbox> {
  const id = s.record.id;
  const before = s.record;
  let vm: Vm | null = null;
  let net: Attachment | null = null;
  try {
    const prior = s.record.network;
    const spec: NetworkSpec = prior
      ? { mode: prior.mode, egress: prior.egress, expose: prior.expose }
      : NO_NETWORK;
    net = await ctx.net.attach(spec, p.nic, prior);
    vm = await ctx.driver.launch(
      {
        dir: s.dir,
        machine: p.machine,
        memory: { path: p.memory, mode: "child" },
        disk: p.disk,
        incoming: true,
        tbSizeMiB: ctx.tbSizeMiB,
        devicesOnlyState: true,
        nic: p.nic ? { guest: guestNetOf(p.nic), backend: net.backend } : undefined,
        netns: net.netns,
        jail: await jailFor(
          ctx,
          await ctx.store.get(s.record.tag),
          limitsFor(p.machine, s.record.limits ?? {}),
        ),
      },
      { binary: net.binary },
    );
    const agent = await vm.connectAgent(10_000);
    await vm.restoreState(p.vmstate);
    if (p.nic && p.nic.linkUp !== net.linkUp) await vm.setLink(net.linkUp);
    ctx.crash("resume:launched");
    if (s.doomed !== null) throw new ForkdError("conflict", `sandbox ${id} was killed while being resumed`);
    const { paused: _p, ...rest } = s.record;
    const deadline =
      opts.deadlineMs === undefined ? {} : { deadline: new Date(Date.now() + opts.deadlineMs).toISOString() };
    const record = (): SandboxRecord => ({
      ...rest,
      ...deadline,
      pid: (vm as Vm).pid,
      pidStartTime: (vm as Vm).id.startTime,
      memoryFile: p.memory,
      network: (net as Attachment).record(),
    });
    s.record = record();
    await saveRecord(s.dir, s.record);
    ctx.crash("resume:recorded");
    await vm.resume();
    // Same identity; the clock has moved on (and the RNG is reseeded) while it was paused.
    await agent.identity(
      { hostname: id, sandboxId: id, netUpWaitMs: p.nic && net.linkUp ? NET_UP_WAIT_MS : undefined },
      ctx.readyTimeoutMs,
    );
    const inherited = await agent.inherited(ctx.readyTimeoutMs);
    await net.start();
    // Relays started: the host ports they answer on.
    const started = record();
    if (JSON.stringify(started.network) !== JSON.stringify(s.record.network)) {
      s.record = started;
      await saveRecord(s.dir, s.record);
    }
    // Its commands ran on in the saved guest: this connection takes them over (handover). Only
    // now: a resume that fails before this leaves them suspended, for the next one.
    s.commands.adopt(inherited);
    markRunning(s, vm, agent, net);
    watchAgent(ctx, s, agent);
    watchVmm(ctx, s, vm);
    await armDiskLimit(ctx, s);
    ctx.log.info("sandbox resumed", { id });
    return s;
  } catch (e) {
    if (s.state === "running") {
      // Only its disk limit failed to arm: it does not run unlimited.
      await retire(s, `resume failed: ${errorMessage(e)}`, true);
    } else {
      await vm?.kill().catch(() => undefined);
      await net?.release();
      if (s.record !== before) {
        s.record = before;
        await saveRecord(s.dir, before).catch((w: unknown) =>
          ctx.log.warn("resume: record not restored", { id, error: errorMessage(w) }),
        );
      }
    }
    throw e;
  }
}
