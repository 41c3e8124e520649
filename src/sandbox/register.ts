/**
 * Putting a sandbox in the live registry, and watching its VMM while it runs: a VMM that exits
 * by itself, an agent channel the guest keeps corrupting, and a disk limit crossed each retire
 * it with the reason.
 */
import type { AgentClient } from "../agent/index.js";
import type { Attachment } from "../net/index.js";
import { errorMessage } from "../util/index.js";
import type { Vm } from "../vmm/index.js";
import type { SandboxContext } from "./context.js";
import { diskLimitHit } from "./disk-limit.js";
import { retire } from "./retire.js";
import { newSandbox } from "./sandbox.js";
import type { Sandbox, SandboxRecord } from "./sandbox.js";

/** Registers a sandbox (running, unless the caller marks it paused) and watches its VMM. */
export function register(
  ctx: SandboxContext,
  record: SandboxRecord,
  dir: string,
  vm: Vm | null,
  agent: AgentClient | null,
  net: Attachment | null,
): Sandbox {
  const s = newSandbox(record, dir, vm, agent, net);
  ctx.live.add(s);
  if (vm) watchVmm(ctx, s, vm);
  if (agent) watchAgent(ctx, s, agent);
  return s;
}

/**
 * Watches `vm`, `s`'s VMM from now on: its exit retires `s`, and so does its disk write
 * threshold (only a sandbox with a disk limit arms one: disk-limit.ts). Events of a VMM that is
 * no longer `s`'s (paused, replaced) are ignored.
 */
export function watchVmm(ctx: SandboxContext, s: Sandbox, vm: Vm): void {
  vm.onExit(() => {
    if (s.vm === vm)
      onExit(ctx, s).catch((e: unknown) =>
        ctx.log.warn("retire failed", { id: s.record.id, error: errorMessage(e) }),
      );
  });
  if (s.record.limits?.diskMiB)
    vm.onDiskWriteThreshold(() => {
      diskLimitHit(ctx, s, vm).catch((e: unknown) =>
        ctx.log.warn("disk limit: retire failed", { id: s.record.id, error: errorMessage(e) }),
      );
    });
}

/**
 * A guest that keeps corrupting its agent channel (the client gave up reconnecting) cannot be
 * served: it is killed, and its exit reason says why.
 */
export function watchAgent(ctx: SandboxContext, s: Sandbox, agent: AgentClient): void {
  agent.once("broken", (why: string) => {
    if (s.agent !== agent || s.state !== "running") return;
    const reason = `killed by the host: ${why}`;
    ctx.log.warn("sandbox agent channel broken", { id: s.record.id, reason });
    retire(s, reason, true).catch((e: unknown) =>
      ctx.log.warn("retire failed", { id: s.record.id, error: errorMessage(e) }),
    );
  });
}

/** A VM that exited without being asked: keep the record (with why), free its files. */
async function onExit(ctx: SandboxContext, s: Sandbox): Promise<void> {
  if (s.state !== "running") return;
  const v = await s.vm?.released;
  const reason = v?.oomKilled
    ? `killed by the host: memory limit of ${v.memoryLimitMiB ?? "?"} MiB exceeded`
    : "vmm process exited";
  ctx.log.warn("sandbox exited", { id: s.record.id, pid: s.record.pid, reason });
  await retire(s, reason, false);
}
