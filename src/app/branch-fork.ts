/**
 * BRANCH-THEN-FORK (E2B's fork): `count` children of a running sandbox the caller may hold, as
 * it is now. One branch of the source (it keeps running, its id and deadline) serves every
 * child; the branch is the source's tenant's, in its namespace, never shared (tag `e2b-fork-…`:
 * ./fork-snapshots.ts deletes it once no child runs from it). The children are the source's
 * tenant's and inherit its metadata, env, deadline action and network (egress, no exposed
 * ports); the caller's quota counts them while they start; the branch's pause, each child's
 * latency and each failure are recorded. Failed children are reported, not thrown (E2B answers
 * per child).
 */
import { randomBytes } from "node:crypto";
import type { Caller } from "../access/index.js";
import type { NetworkSpec } from "../net/index.js";
import type { BranchResult } from "../sandbox/index.js";
import type { ForkOptions, ForkResult } from "../sandbox/index.js";
import type { ReadonlySandbox } from "../sandbox/index.js";
import { keyIn } from "../snapshot/index.js";
import { ForkdError } from "../util/index.js";
import { recordFork, withQuota } from "./fork.js";
import { FORK_TAG_PREFIX, reapLater } from "./fork-snapshots.js";
import { liveSandbox } from "./scope.js";
import type { Services } from "./services.js";

/** What the children get besides what they inherit: their deadline, the door's own settings. */
export type BranchForkOptions = Omit<ForkOptions, "owner" | "metadata" | "env" | "onDeadline" | "network">;

export interface BranchForkResult {
  source: ReadonlySandbox;
  branch: BranchResult;
  children: ForkResult;
}

export async function branchThenFork(
  s: Services,
  caller: Caller,
  id: string,
  count: number,
  opts: (source: ReadonlySandbox) => BranchForkOptions,
): Promise<BranchForkResult> {
  const src = liveSandbox(s, caller, id);
  if (src.state !== "running")
    throw new ForkdError("conflict", `sandbox ${src.record.id} is paused: only a running sandbox forks`);
  const owner = src.record.owner ?? null;
  try {
    return await withQuota(s, caller, count, async () => {
      const tag = keyIn(owner, `${FORK_TAG_PREFIX}${randomBytes(6).toString("hex")}`);
      const branch = await s.sandboxes.branch(src.record.id, tag, true, true);
      s.metrics.branchPause(branch.pauseMs / 1000);
      const children = await s.sandboxes.fork(branch.tag, count, {
        ...opts(src),
        owner,
        metadata: src.record.metadata ?? {},
        env: src.record.env,
        onDeadline: src.record.onDeadline ?? "kill",
        network: specOf(src),
      });
      recordFork(s, children);
      return { source: src, branch, children };
    });
  } finally {
    reapLater(s);
  }
}

/** The network spec a running sandbox has, for its forks. */
function specOf(sb: ReadonlySandbox): NetworkSpec | undefined {
  const n = sb.record.network;
  return n ? { mode: n.mode, egress: n.egress, expose: [] } : undefined;
}
