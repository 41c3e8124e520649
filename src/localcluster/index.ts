/**
 * What localcluster offers: a real forkd cluster on one machine (etcd members and forkd nodes in
 * network namespaces of their own, gateways), brought up, described and removed. It only spawns
 * processes: no daemon or gateway code is imported. Other folders import this folder through
 * this file alone (test/unit/layering.test.ts).
 */
export { up } from "./up.js";
export { down } from "./down.js";
export { status } from "./status.js";
export { exportLines } from "./describe.js";
export { inheritedSettings } from "./specs.js";
