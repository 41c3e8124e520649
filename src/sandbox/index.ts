/**
 * What sandbox offers: the sandbox service (fork, branch, pause, resume, kill, the warm pool,
 * commands) and the domain sandbox. Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { ADMIN_ONLY_OWNER } from "./branch.js";
export type { BranchResult } from "./branch.js";
export type { SandboxCluster } from "./cluster.js";
export { startCommand } from "./commands/start.js";
export type { StartIn, StartedCommand } from "./commands/start.js";
export { argvOf } from "./commands/table.js";
export type { CommandTable, CommandTap, EndedCommand, RunningCommand } from "./commands/table.js";
export type { ForkFailure, ForkOptions, ForkResult } from "./fork.js";
export type { Lease } from "./lease.js";
export { MAX_FORK } from "./limits.js";
export { poolDefaults } from "./pool.js";
export type { PoolOptions, PoolState } from "./pool.js";
export { RECORD_BUDGET, jsonChars } from "./record-budget.js";
export type { SandboxEvent } from "./registry.js";
export type { ResumeOptions } from "./resume.js";
export { endsAt, expiresAt } from "./sandbox.js";
export type { ReadonlySandbox } from "./sandbox.js";
export { SandboxService } from "./service.js";
