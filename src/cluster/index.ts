/**
 * What cluster offers: forkd across hosts on etcd: the keyspace, the records kept there, a
 * snapshot's cluster-wide digest.
 */
export { ClusterKeys, DEFAULT_PREFIX, NODE_ID_RE, assertNodeId, keyOfSegment, keySegment } from "./keys.js";
export { ClusterTokens } from "./cluster-tokens.js";
export { snapshotDigest } from "./digest.js";
export type { DigestInput } from "./digest.js";
export {
  CatalogEntry,
  Holding,
  MAX_RECORD_BYTES,
  MachineKind,
  NodeRecord,
  SandboxLocation,
  SandboxState,
  parseRecord,
} from "./records.js";
