/**
 * What each process of a local cluster runs, with which environment: an etcd member (static
 * initial cluster, short heartbeat and election for tests), a forkd node (`forkd daemon` in its
 * namespace, with the cluster settings of docs/cluster.md), a gateway (`forkd gateway` in the
 * root namespace on loopback ports). Each carries the cluster's marker (./sweep.ts).
 */
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { childEnv, downloadEnv } from "../util/index.js";
import {
  ETCD_CLIENT_PORT,
  ETCD_PEER_PORT,
  NODE_E2B_PORT,
  NODE_PORT,
  clusterEnvValue,
  etcdAddr,
  etcdClientUrl,
  etcdName,
  etcdPeerUrl,
  memberNetns,
  nodeAddr,
  nodeE2bUrl,
  nodeName,
  nodeUrl,
} from "./layout.js";
import type { ClusterState, Proc } from "./state.js";
import { MARKER } from "./sweep.js";

/** The CLI of this build (dist/src/cli/main.js). */
export const DEFAULT_CLI = fileURLToPath(new URL("../cli/main.js", import.meta.url));

export interface EtcdTuning {
  /** The etcd binary (default: `etcd` on PATH). */
  binary?: string;
  /** --heartbeat-interval (ms): 50 by default (etcd's own: 100). */
  heartbeatMs?: number;
  /** --election-timeout (ms): 500 by default (etcd's own: 1000): a dead leader is replaced within ~1 s. */
  electionMs?: number;
}

/**
 * Settings a caller's environment passes to every node and gateway (FORKD_ACCEL, FORKD_POOL_SIZE,
 * ...): its FORKD_* variables but those the cluster sets itself and those that name a client's
 * daemon, a listener's TLS files or a test's crash point.
 */
export function inheritedSettings(env: NodeJS.ProcessEnv): Record<string, string> {
  const owned = new Set([
    "FORKD_DATA_DIR",
    "FORKD_CACHE_DIR",
    "FORKD_SOCKET",
    "FORKD_URL",
    "FORKD_TOKEN",
    "FORKD_TOKENS_FILE",
    "FORKD_CA_CERT",
    "FORKD_SNAPSHOT",
    "FORKD_LISTEN",
    "FORKD_E2B_LISTEN",
    "FORKD_TLS_CERT",
    "FORKD_TLS_KEY",
    "FORKD_CLUSTER",
    "FORKD_NODE_ID",
    "FORKD_NODE_ADDR",
    "FORKD_NODE_E2B_ADDR",
    "FORKD_CLUSTER_SECRET_FILE",
    "FORKD_GATEWAY_LISTEN",
    "FORKD_GATEWAY_E2B_LISTEN",
    "FORKD_NET_ID",
    "FORKD_NET_SUBNET",
    "FORKD_EXPOSE_ADDR",
    "FORKD_TEST_CRASH_AT",
    MARKER,
  ]);
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env))
    if (k.startsWith("FORKD_") && !owned.has(k) && v !== undefined) out[k] = v;
  return out;
}

const base = (st: ClusterState, from: NodeJS.ProcessEnv): Record<string, string> => ({
  ...childEnv(downloadEnv(from), from),
  [MARKER]: st.id,
});

/** etcd member `i` (1-based) of `members`. */
export function etcdProc(
  st: ClusterState,
  i: number,
  members: number,
  t: EtcdTuning,
  from: NodeJS.ProcessEnv,
): Proc {
  const name = etcdName(i);
  const initial = Array.from({ length: members }, (_, j) => `${etcdName(j + 1)}=${etcdPeerUrl(st.k, j + 1)}`);
  const addr = etcdAddr(st.k, i);
  return {
    name,
    role: "etcd",
    netns: memberNetns(st.id, name),
    sysfs: false,
    argv: [
      t.binary ?? "etcd",
      `--name=${name}`,
      `--data-dir=${join(st.dir, "etcd", name)}`,
      `--listen-client-urls=http://${addr}:${ETCD_CLIENT_PORT}`,
      `--advertise-client-urls=${etcdClientUrl(st.k, i)}`,
      `--listen-peer-urls=http://${addr}:${ETCD_PEER_PORT}`,
      `--initial-advertise-peer-urls=${etcdPeerUrl(st.k, i)}`,
      `--initial-cluster=${initial.join(",")}`,
      `--initial-cluster-token=fkcl-${st.id}`,
      "--initial-cluster-state=new",
      `--heartbeat-interval=${t.heartbeatMs ?? 50}`,
      `--election-timeout=${t.electionMs ?? 500}`,
      "--logger=zap",
      "--log-outputs=stderr",
    ],
    env: base(st, from),
    log: join(st.dir, "logs", `${name}.log`),
    probe: `${etcdClientUrl(st.k, i)}/health`,
    auth: false,
    pid: null,
    start: null,
  };
}

/** forkd node `i` (1-based). */
export function nodeProc(
  st: ClusterState,
  i: number,
  o: { cli: string; settings: Record<string, string>; from: NodeJS.ProcessEnv },
): Proc {
  const name = nodeName(i);
  const n = st.nodes[i - 1];
  if (!n) throw new Error(`no node ${i} in the record`);
  const addr = nodeAddr(st.k, i);
  return {
    name,
    role: "node",
    netns: memberNetns(st.id, name),
    sysfs: true,
    argv: [process.execPath, o.cli, "daemon"],
    env: {
      ...base(st, o.from),
      ...o.settings,
      FORKD_DATA_DIR: n.dataDir,
      FORKD_CACHE_DIR: n.cacheDir,
      FORKD_LISTEN: `${addr}:${NODE_PORT}`,
      FORKD_E2B_LISTEN: `${addr}:${NODE_E2B_PORT}`,
      FORKD_TOKEN: st.token,
      FORKD_CLUSTER: clusterEnvValue(st.k, st.etcd.length),
      FORKD_NODE_ID: name,
      FORKD_NODE_ADDR: nodeUrl(st.k, i),
      FORKD_NODE_E2B_ADDR: nodeE2bUrl(st.k, i),
      FORKD_CLUSTER_SECRET_FILE: st.secretFile,
      FORKD_NET_ID: n.netId,
      // Exposed guest ports listen on the node's address, where gateways reach them.
      FORKD_EXPOSE_ADDR: addr,
    },
    log: join(st.dir, "logs", `${name}.log`),
    probe: `${nodeUrl(st.k, i)}/v1/health`,
    auth: true,
    pid: null,
    start: null,
  };
}

/** Gateway `i` (1-based), on the loopback ports recorded for it. */
export function gatewayProc(
  st: ClusterState,
  i: number,
  o: { cli: string; settings: Record<string, string>; from: NodeJS.ProcessEnv },
): Proc {
  const g = st.gateways[i - 1];
  if (!g) throw new Error(`no gateway ${i} in the record`);
  const hostPort = (url: string) => new URL(url).host;
  return {
    name: g.name,
    role: "gateway",
    netns: null,
    sysfs: false,
    argv: [process.execPath, o.cli, "gateway"],
    env: {
      ...base(st, o.from),
      ...o.settings,
      FORKD_DATA_DIR: join(st.dir, "gateways", g.name),
      FORKD_GATEWAY_LISTEN: hostPort(g.url),
      FORKD_GATEWAY_E2B_LISTEN: hostPort(g.e2bUrl),
      FORKD_TOKEN: st.token,
      FORKD_CLUSTER: clusterEnvValue(st.k, st.etcd.length),
      FORKD_CLUSTER_SECRET_FILE: st.secretFile,
    },
    log: join(st.dir, "logs", `${g.name}.log`),
    probe: `${g.url}/v1/health`,
    auth: true,
    pid: null,
    start: null,
  };
}
