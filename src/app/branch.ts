/**
 * BRANCH AS A CALLER: a snapshot of a running sandbox the caller may hold, tagged in the
 * sandbox's tenant's namespace (an admin's plain tag for a tenant's sandbox lands in that
 * tenant's; a taken or reserved tag refused: ./scope.ts newBranchKey), its pause recorded in the
 * metrics. `private`: an admin's branch is the admins' alone, never shared (E2B's snapshots).
 * The REST API's POST /v1/sandboxes/{id}/branch and E2B's POST /sandboxes/{id}/snapshots.
 */
import type { Caller } from "../access/index.js";
import type { BranchResult } from "../sandbox/index.js";
import { newBranchKey, sandboxOf } from "./scope.js";
import type { Services } from "./services.js";

export interface BranchAsOptions {
  /** Reply once the snapshot is ready (else once the sandbox runs again). */
  wait: boolean;
  private?: boolean;
}

export async function branchAs(
  s: Services,
  caller: Caller,
  id: string,
  tag: string | undefined,
  o: BranchAsOptions,
): Promise<BranchResult> {
  const sb = sandboxOf(s, caller, id);
  const key = await newBranchKey(s, caller, sb.record.owner ?? null, tag);
  const r = await s.sandboxes.branch(id, key, o.wait, o.private ?? false);
  s.metrics.branchPause(r.pauseMs / 1000);
  return r;
}
