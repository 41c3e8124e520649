/**
 * The cluster's keyspace in etcd, under one prefix (FORKD_CLUSTER_PREFIX, default `/forkd/`;
 * several clusters may share one etcd under different prefixes):
 *
 *   nodes/<node>                 NodeRecord, under the node's lease (gone when the node is)
 *   holdings/<node>/<key>        Holding: a snapshot the node has, under the node's lease
 *   catalog/<key>                CatalogEntry: a snapshot of the cluster (tags are cluster-wide)
 *   pushes/<key>/<ref id>        PushRecord: a push of the snapshot to an OCI registry (a node
 *                                no live peer serves fetches it from there)
 *   sandboxes/<id>               SandboxLocation: where a sandbox runs, its state as last known
 *   by-node/<node>/<id>          "" while the sandbox is the node's (running or paused)
 *   by-owner/<tenant>/<id>       "" while a tenant's sandbox is running or paused (quota)
 *   tokens/<id>                  an API token (src/access/tokens.ts's entry)
 *   cluster-id                   a random name the first node gives the cluster (create-only):
 *                                a node whose etcd was started afresh knows it is a new cluster
 *   quota/<tenant>               the guard of a tenant's admissions: every gateway that reserves
 *                                sandboxes for the tenant changes it in the same transaction
 *                                (compare-and-swap on its revision: src/cluster/quota.ts)
 *   reservations/<tenant>/<r>    sandboxes a gateway's fork in flight may add (a count), under
 *                                that gateway's lease
 *   console-tickets/<sha256>     a console ticket used once (its expiry, ms), swept after it
 *
 * A snapshot key `alice/app` is written `alice~app` in a key (as in the store's directories:
 * `~` is in no tenant or tag), so every key segment is one path component.
 */
import { ForkdError } from "../util/index.js";
import { KEY_RE, SANDBOX_ID_RE, TENANT_RE } from "../util/index.js";

export const NODE_ID_RE = /^[a-z0-9][a-z0-9-]{0,62}$/;
export const DEFAULT_PREFIX = "/forkd/";
const PREFIX_RE = /^\/[A-Za-z0-9_./-]{0,200}\/$/;

export function assertNodeId(id: string): void {
  if (!NODE_ID_RE.test(id))
    throw new ForkdError("invalid_argument", `node id must match ${NODE_ID_RE.source}`, { field: "node" });
}

/** A snapshot key as one key segment, and back (null: not a snapshot key). */
export const keySegment = (key: string): string => key.replace("/", "~");
export function keyOfSegment(seg: string): string | null {
  const key = seg.replace("~", "/");
  return KEY_RE.test(key) ? key : null;
}

/** The keys of one cluster (under its prefix). */
export class ClusterKeys {
  readonly prefix: string;

  constructor(prefix: string = DEFAULT_PREFIX) {
    if (!PREFIX_RE.test(prefix) || prefix.includes("//"))
      throw new ForkdError("invalid_argument", "FORKD_CLUSTER_PREFIX must look like /name/", {
        field: "FORKD_CLUSTER_PREFIX",
      });
    this.prefix = prefix;
  }

  get nodes(): string {
    return `${this.prefix}nodes/`;
  }
  node(id: string): string {
    return `${this.nodes}${id}`;
  }
  get holdingsAll(): string {
    return `${this.prefix}holdings/`;
  }
  holdings(node: string): string {
    return `${this.holdingsAll}${node}/`;
  }
  holding(node: string, key: string): string {
    return `${this.holdings(node)}${keySegment(key)}`;
  }
  get catalog(): string {
    return `${this.prefix}catalog/`;
  }
  catalogEntry(key: string): string {
    return `${this.catalog}${keySegment(key)}`;
  }
  /** Every recorded push of `key` (records.ts PushRecord). */
  pushesOf(key: string): string {
    return `${this.prefix}pushes/${keySegment(key)}/`;
  }
  /** The record of `key`'s push to the reference whose id (a hash of it) is `refId`. */
  push(key: string, refId: string): string {
    return `${this.pushesOf(key)}${refId}`;
  }
  get sandboxes(): string {
    return `${this.prefix}sandboxes/`;
  }
  sandbox(id: string): string {
    return `${this.sandboxes}${id}`;
  }
  get byNodeAll(): string {
    return `${this.prefix}by-node/`;
  }
  byNode(node: string): string {
    return `${this.prefix}by-node/${node}/`;
  }
  byNodeEntry(node: string, id: string): string {
    return `${this.byNode(node)}${id}`;
  }
  byOwner(tenant: string): string {
    return `${this.prefix}by-owner/${tenant}/`;
  }
  byOwnerEntry(tenant: string, id: string): string {
    return `${this.byOwner(tenant)}${id}`;
  }
  get clusterId(): string {
    return `${this.prefix}cluster-id`;
  }
  quotaGuard(tenant: string): string {
    return `${this.prefix}quota/${tenant}`;
  }
  reservations(tenant: string): string {
    return `${this.prefix}reservations/${tenant}/`;
  }
  reservation(tenant: string, id: string): string {
    return `${this.reservations(tenant)}${id}`;
  }
  get consoleTickets(): string {
    return `${this.prefix}console-tickets/`;
  }
  consoleTicket(digest: string): string {
    return `${this.consoleTickets}${digest}`;
  }
  get tokens(): string {
    return `${this.prefix}tokens/`;
  }
  token(id: string): string {
    return `${this.tokens}${id}`;
  }

  /** The last segment of `key` under `under`, checked by `re` (null: not one of ours). */
  tail(key: string, under: string, re: RegExp): string | null {
    if (!key.startsWith(under)) return null;
    const t = key.slice(under.length);
    return re.test(t) ? t : null;
  }
}

export { SANDBOX_ID_RE, TENANT_RE };
