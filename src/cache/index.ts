/**
 * What cache offers: the shared guest-image and layer cache under /var/cache/forkd: entries, pins,
 * locks, references and garbage collection. Other folders import this folder through this file
 * alone (test/unit/layering.test.ts).
 */
export { collect, survey } from "./collect.js";
export type { CollectResult } from "./collect.js";
export { CacheKeeper, cacheSettingsFromEnv } from "./keeper.js";
export type { PinScope } from "./pins.js";
export type { PlannedEntry } from "./plan.js";
export { qcow2Backing } from "./qcow2-backing.js";
export { describe } from "./references.js";
