/**
 * What snapshot offers: the snapshot store and service (create, seal, chains, packs, push and
 * pull, tags by namespace). Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { BlobCache } from "./blobs.js";
export type { DeletePlan } from "./chain.js";
export type { SnapshotCluster } from "./cluster.js";
export { buildNetworkOf } from "./dockerfile.js";
export { SnapshotMetaSchema, nicMeta, readMeta } from "./meta.js";
export type { NicMeta, SnapshotMeta } from "./meta.js";
export { Namespaces, keyIn, nameFor, reservedTags, shownTo, splitKey, visibleTo } from "./namespace.js";
export type { KeyEntry, KeyLookup, Viewer } from "./namespace.js";
export { SnapshotService } from "./service.js";
export { SnapshotStore, memoryDiffFile } from "./store.js";
export type { Snapshot, SnapshotEvent, SnapshotPending } from "./store.js";
export { unpackMaxFromEnv } from "./unpack-budget.js";
