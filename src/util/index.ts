/**
 * What util offers: small generic pieces (atomic files, errors, ids, logs, processes, time,
 * addresses). Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { asRoot } from "./as-root.js";
export { fsyncDir, writeFileAtomic, writeJsonAtomic } from "./atomic.js";
export { NO_CRASH, crashPointFromEnv } from "./crash.js";
export type { CrashPoint } from "./crash.js";
export { statusOf } from "./error-status.js";
export { ERROR_CODES, ForkdError, errorMessage, isForkdError } from "./errors.js";
export type { ErrorCode } from "./errors.js";
export { readFileTail } from "./file-tail.js";
export { exists, linkOrCopy } from "./fs.js";
export {
  KEY_RE,
  SANDBOX_ID_RE,
  TAG_RE,
  TEMPLATE_RE,
  TENANT_RE,
  assertKey,
  assertSandboxId,
  assertTemplate,
  isValidKey,
  isValidTag,
  newRandomId,
  newSandboxId,
} from "./ids.js";
export { ipBytes, ipKey, notPublic } from "./ip.js";
export { ConnectionGate, DEFAULT_LIMITS, guard, httpOptions } from "./listener-guard.js";
export type { ListenerLimits } from "./listener-guard.js";
export { jsonLogger } from "./log.js";
export type { Logger } from "./log.js";
export { dialUnix } from "./net.js";
export { nodeTrust, readNodeTrust } from "./node-trust.js";
export { PausableTimer } from "./pausable-timer.js";
export { childEnv, downloadEnv, isAlive, processCmdline, processStartTime, run } from "./proc.js";
export type { RunResult } from "./proc.js";
export type { Progress } from "./progress.js";
export { Quarantine } from "./quarantine.js";
export { settleWithLimit } from "./settle-with-limit.js";
export { nowMs, since, sleep } from "./time.js";
