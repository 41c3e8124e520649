/**
 * What host offers: facts about this host (paths, cgroups, native tools, forkd's version) and the
 * lock that makes one daemon own a data directory. Other folders import this folder through this
 * file alone (test/unit/layering.test.ts).
 */
export { Cgroups } from "./cgroups.js";
export type { VmLimits } from "./cgroups.js";
export { acquireDaemonLock, daemonHoldsLock } from "./daemon-lock.js";
export { NATIVE_FIX, findJailer, findMemsnap } from "./native.js";
export { defaultPaths, sandboxesDir, snapshotsDir } from "./paths.js";
export type { Paths } from "./paths.js";
export { VERSION } from "./version.js";
