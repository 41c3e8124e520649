/**
 * PAUSE, RESUME AND KILL AS A CALLER: of a sandbox the caller may hold (else not found, as one
 * that does not exist). A kill then deletes the fork snapshots no sandbox needs any more
 * (./fork-snapshots.ts), whichever door it came through.
 */
import type { Caller } from "../access/index.js";
import type { ResumeOptions } from "../sandbox/index.js";
import type { ReadonlySandbox } from "../sandbox/index.js";
import { reapLater } from "./fork-snapshots.js";
import { sandboxOf } from "./scope.js";
import type { Services } from "./services.js";

export async function pauseAs(s: Services, caller: Caller, id: string): Promise<ReadonlySandbox> {
  return s.sandboxes.pause(sandboxOf(s, caller, id).record.id);
}

export async function resumeAs(
  s: Services,
  caller: Caller,
  id: string,
  opts?: ResumeOptions,
): Promise<ReadonlySandbox> {
  return s.sandboxes.resume(sandboxOf(s, caller, id).record.id, opts);
}

export async function killAs(s: Services, caller: Caller, id: string): Promise<void> {
  await s.sandboxes.kill(sandboxOf(s, caller, id).record.id);
  reapLater(s);
}
