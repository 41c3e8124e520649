/**
 * E2B's settings of a sandbox (record.e2b, src/e2b): replaced as a whole and written with the
 * record, for a running or paused sandbox.
 */
import { ForkdError } from "../util/index.js";
import type { SandboxContext } from "./context.js";
import { saveRecord } from "./record.js";
import type { E2bRecord, Sandbox } from "./sandbox.js";

export async function setE2bSettings(ctx: SandboxContext, id: string, e2b: E2bRecord): Promise<Sandbox> {
  const s = ctx.live.get(id);
  if (s.state === "exited")
    throw new ForkdError("conflict", `sandbox ${id} has exited`, { id, state: s.state });
  s.record = { ...s.record, e2b };
  await saveRecord(s.dir, s.record);
  return s;
}
