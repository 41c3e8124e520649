/**
 * What every part of a cluster node is given (catalog.ts, holdings.ts, locations.ts, ...): the
 * store and its keys, the node's identity and membership, what it mirrors of the cluster, and
 * the daemon's services it works for. Built once by ClusterNode (node.ts) when it starts.
 */
import type { Kv, PrefixMirror } from "../etcd/index.js";
import type { SandboxService } from "../sandbox/index.js";
import type { SnapshotMeta, SnapshotService, SnapshotStore } from "../snapshot/index.js";
import type { Logger } from "../util/index.js";
import type { Fence } from "./fence.js";
import type { HeldDigests } from "./held-digests.js";
import type { ClusterKeys } from "./keys.js";
import type { Membership } from "./membership.js";
import type { CatalogEntry, MachineKind } from "./records.js";

export interface NodeContext {
  readonly kv: Kv;
  readonly keys: ClusterKeys;
  /** This node's id (FORKD_NODE_ID). */
  readonly id: string;
  readonly log: Logger;
  /** What this node's VMMs restore on (a snapshot restores only on the same). */
  readonly machine: MachineKind;
  readonly member: Membership;
  readonly fence: Fence;
  readonly held: HeldDigests;
  /** catalog/, mirrored (src/etcd/mirror.ts); nodes/ is read when needed (ensure.ts liveNodes). */
  readonly catalog: PrefixMirror<CatalogEntry>;
  readonly store: SnapshotStore;
  readonly sandboxes: SandboxService;
  readonly snapshots: SnapshotService;
  /** A snapshot as the REST API shows it (a catalog entry's `view`). */
  readonly view: (meta: SnapshotMeta) => Record<string, unknown>;
}
