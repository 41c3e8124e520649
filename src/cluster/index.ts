/**
 * What cluster offers: forkd across hosts on etcd: the keyspace, the records kept there, a
 * snapshot's cluster-wide digest, a node (the daemon as a member of a cluster), the views gateways
 * keep of it, placement, the tenant quota across nodes, the janitor of lost sandboxes, console
 * tickets used once.
 */
export { ClusterKeys, DEFAULT_PREFIX, NODE_ID_RE, assertNodeId, keyOfSegment, keySegment } from "./keys.js";
export { ClusterTokens } from "./cluster-tokens.js";
export { snapshotDigest } from "./digest.js";
export { peerTransferUnavailable } from "./ensure.js";
export type { Holder, PeerPull, RegistryPull } from "./ensure.js";
export { ClusterNode } from "./node.js";
export type { ClusterNodeOptions, NodeServices } from "./node.js";
export { Janitor, LOST_KEEP_MS, forgetLost, lostReason } from "./janitor.js";
export { HELD_BONUS, WARM_BONUS, eligible, mostRoom, place, sameMachine } from "./placement.js";
export type { Candidate, Placement, PlacementResult } from "./placement.js";
export { ClusterQuota } from "./quota.js";
export type { Reservation } from "./quota.js";
export { UsedTickets } from "./tickets.js";
export { ClusterView } from "./view.js";
export type { NodeHolding } from "./view.js";
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
