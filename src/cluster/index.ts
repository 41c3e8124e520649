/**
 * What cluster offers: forkd across hosts on etcd: the keyspace, the records kept there, a
 * snapshot's cluster-wide digest, and a node (the daemon as a member of a cluster).
 */
export { ClusterKeys, DEFAULT_PREFIX, NODE_ID_RE, assertNodeId, keyOfSegment, keySegment } from "./keys.js";
export { ClusterTokens } from "./cluster-tokens.js";
export { snapshotDigest } from "./digest.js";
export { peerTransferUnavailable } from "./ensure.js";
export type { Holder, PeerPull } from "./ensure.js";
export { ClusterNode } from "./node.js";
export type { ClusterNodeOptions, NodeServices } from "./node.js";
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
