/**
 * What app offers the front doors: each use case (fork as a caller, branch, exec, files, pause and
 * resume, kill, snapshot operations) with its scoping, quota, admission, audit and metrics,
 * written once. Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { admit, admittedBy, authFailed, authRefusal, isMutating, retryAfter } from "./admission.js";
export { DEFAULT_BODY_LIMITS, tooLarge } from "./body-limits.js";
export type { BodyLimits } from "./body-limits.js";
export { branchThenFork } from "./branch-fork.js";
export { branchAs } from "./branch.js";
export { recordCall, startCall } from "./call-record.js";
export type { CallStart } from "./call-record.js";
export { CellEnv } from "./cell-env.js";
export { CommandRun } from "./exec.js";
export { FORK_TAG_PREFIX } from "./fork-snapshots.js";
export { forkAs } from "./fork.js";
export type { CallerForkOptions } from "./fork.js";
export { killAs, pauseAs, resumeAs } from "./lifecycle.js";
export { redactHostPaths } from "./redact.js";
export type { HostDirs } from "./redact.js";
export {
  liveSandbox,
  mayHold,
  newSnapshotKey,
  noSandbox,
  noSnapshot,
  ownedSnapshot,
  tagNames,
  viewerOf,
  visibleMetas,
  visiblePending,
  visibleSnapshot,
} from "./scope.js";
export type { TagNames } from "./scope.js";
export type { ClusterAdmission, Services } from "./services.js";
export { deleteSnapshotAs, planDeleteAs, snapshotAs, snapshotsOf } from "./snapshots.js";
