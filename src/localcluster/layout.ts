/**
 * The names, addresses and ports of a local cluster, derived from its id and its /24 in one place
 * (nothing else makes a name). A cluster `<cid>` (6 characters, [a-z0-9]) on 10.240.K.0/24:
 *
 *   hub network namespace   fkcl-<cid>-hub     bridge br0; the root link's peer `root0` on it
 *   root link               fkcl<cid>          in the root namespace: 10.240.K.1/24 (gateways and
 *                                              the caller reach the cluster through it)
 *   member namespace        fkcl-<cid>-<m>     m = e1.. (etcd members), n1.. (forkd nodes); its
 *                                              link `eth0` (peer `<m>` on the hub's bridge)
 *   etcd member i           10.240.K.(10+i)    client :2379, peer :2380
 *   node i                  10.240.K.(100+i)   REST :7070, E2B :3000
 *   root nft table          ip fkcl_<cid>      masquerades the cluster's traffic out of the host
 *
 * The "fkcl" prefix never matches the names a forkd daemon gives its own slots (`forkd-<hex4>-i`,
 * `fk<hex4>h<i>`: src/net/slots.ts), and 10.240.0.0/16 is outside their 10.200.0.0/13.
 */
import { randomBytes } from "node:crypto";
import { ForkdError } from "../util/index.js";

export const CLUSTER_ID_RE = /^[a-z0-9]{6}$/;
export const MAX_ETCD = 9;
export const MAX_NODES = 150;
export const ETCD_CLIENT_PORT = 2379;
export const ETCD_PEER_PORT = 2380;
export const NODE_PORT = 7070;
export const NODE_E2B_PORT = 3000;
/** The link of a member namespace onto the hub, and the bridge in the hub. */
export const MEMBER_IF = "eth0";
export const HUB_BRIDGE = "br0";
export const HUB_UPLINK = "root0";

const ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";

export function newClusterId(): string {
  return [...randomBytes(6)].map((b) => ALPHABET[b % ALPHABET.length]).join("");
}

export function assertClusterId(cid: string): void {
  if (!CLUSTER_ID_RE.test(cid))
    throw new ForkdError("invalid_argument", `bad cluster id ${JSON.stringify(cid)}`);
}

export const etcdName = (i: number): string => `e${i}`;
export const nodeName = (i: number): string => `n${i}`;
export const hubNetns = (cid: string): string => `fkcl-${cid}-hub`;
export const memberNetns = (cid: string, member: string): string => `fkcl-${cid}-${member}`;
export const rootLink = (cid: string): string => `fkcl${cid}`;
export const natTable = (cid: string): string => `fkcl_${cid}`;
/** The table a cut (test/helpers/cluster.ts) adds inside a member's namespace. */
export const CUT_TABLE = "fkcl_cut";

export const subnetOf = (k: number): string => `10.240.${k}.0/24`;
export const rootAddr = (k: number): string => `10.240.${k}.1`;
export const etcdAddr = (k: number, i: number): string => `10.240.${k}.${10 + i}`;
export const nodeAddr = (k: number, i: number): string => `10.240.${k}.${100 + i}`;
export const etcdClientUrl = (k: number, i: number): string => `http://${etcdAddr(k, i)}:${ETCD_CLIENT_PORT}`;
export const etcdPeerUrl = (k: number, i: number): string => `http://${etcdAddr(k, i)}:${ETCD_PEER_PORT}`;
export const nodeUrl = (k: number, i: number): string => `http://${nodeAddr(k, i)}:${NODE_PORT}`;
export const nodeE2bUrl = (k: number, i: number): string => `http://${nodeAddr(k, i)}:${NODE_E2B_PORT}`;

/** FORKD_CLUSTER for a cluster of `members` etcd members on 10.240.K.0/24. */
export const clusterEnvValue = (k: number, members: number): string =>
  "etcd://" +
  Array.from({ length: members }, (_, j) => `${etcdAddr(k, j + 1)}:${ETCD_CLIENT_PORT}`).join(",");

/** Checks the sizes `up` is asked for. */
export function checkSizes(o: { nodes: number; gateways: number; etcdMembers: number }): void {
  const int = (v: number, name: string, min: number, max: number) => {
    if (!Number.isSafeInteger(v) || v < min || v > max)
      throw new ForkdError("invalid_argument", `${name} must be an integer ${min}..${max}, not ${v}`);
  };
  int(o.nodes, "nodes", 1, MAX_NODES);
  int(o.gateways, "gateways", 0, 16);
  int(o.etcdMembers, "etcd members", 1, MAX_ETCD);
}
