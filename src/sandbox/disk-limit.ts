/**
 * A sandbox's disk limit: what it wrote to disk (its own layers: the top one and those branches
 * froze) is held to `limits.diskMiB`. QEMU reports the first write to the top layer past what is
 * left, and the sandbox is killed with that reason.
 */
import { stat } from "node:fs/promises";
import type { Vm } from "../vmm/index.js";
import type { SandboxContext } from "./context.js";
import { retire } from "./retire.js";
import type { Sandbox } from "./sandbox.js";

/**
 * Arms the write threshold of `s`'s top layer (no disk limit, or not running: nothing). Re-armed
 * whenever its top layer changes (a branch, a resume) and after a daemon restart.
 */
export async function armDiskLimit(ctx: SandboxContext, s: Sandbox): Promise<void> {
  const mib = s.record.limits?.diskMiB;
  const vm = s.vm;
  if (!mib || !vm || s.state !== "running") return;
  const { top, topNode, files } = await vm.diskLayers();
  let lower = 0;
  for (const f of files) if (f !== top && f.startsWith(s.dir + "/")) lower += (await stat(f)).size;
  const left = mib * 1024 * 1024 - lower;
  if (left <= (await stat(top)).size) await diskLimitHit(ctx, s, vm);
  else await vm.setWriteThreshold(topNode, left);
}

/** `vm` (if still `s`'s and running) crossed the threshold: `s` is killed, saying why. */
export async function diskLimitHit(ctx: SandboxContext, s: Sandbox, vm: Vm): Promise<void> {
  if (s.vm !== vm || s.state !== "running") return;
  const reason = `killed by the host: disk limit of ${s.record.limits?.diskMiB ?? "?"} MiB exceeded`;
  ctx.log.warn("sandbox exceeded its disk limit", { id: s.record.id, pid: s.record.pid });
  await retire(s, reason, true);
}
