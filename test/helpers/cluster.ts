/**
 * The suite's local cluster (src/localcluster): real etcd members, forkd nodes each in a network
 * namespace of its own (own address, data dir and image cache: node 1 the shared one, the others
 * empty), gateways; one per test file, or one shared by several files when
 * FORKD_IT_CLUSTER_DIR names a cluster already up (`forkd cluster up --dir D`; it is then left up).
 *
 * Faults, each touching only what this cluster made: a node, etcd member or gateway killed with
 * SIGKILL and started again (same data directory, same command); a node cut off the network (an
 * nft table inside its namespace dropping everything through its one link onto the hub, `eth0`,
 * in and out: whatever a cable pulled out would stop; its own loopback and its sandboxes' slots
 * still work) and healed; its sending throttled (tc tbf on that link); the etcd leader found (etcdctl endpoint status) and killed.
 */
import { execFile } from "node:child_process";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { down } from "../../src/localcluster/down.js";
import { describe as describeCluster } from "../../src/localcluster/describe.js";
import type { ClusterInfo } from "../../src/localcluster/describe.js";
import { inNetns } from "../../src/localcluster/host-net.js";
import { CUT_TABLE, MEMBER_IF, memberNetns } from "../../src/localcluster/layout.js";
import { running } from "../../src/localcluster/launch.js";
import { restartProc, stopProc } from "../../src/localcluster/processes.js";
import { procOf, readState } from "../../src/localcluster/state.js";
import type { ClusterState } from "../../src/localcluster/state.js";
import { up } from "../../src/localcluster/up.js";
import type { UpOptions } from "../../src/localcluster/up.js";
import { probe } from "../../src/localcluster/waits.js";
import type { Endpoint } from "./http.js";

const run = promisify(execFile);

export interface TestCluster {
  info: ClusterInfo;
  /** The live record (pids change as processes are restarted). */
  st: ClusterState;
  token: string;
  /** Node `id`'s REST endpoint (its namespace's address, the admin token). */
  node(id: string): Endpoint;
  /** Gateway `name`'s REST endpoint. */
  gateway(name: string): Endpoint;
  /** Whether GET /v1/health of node `id` answers 200 now (one try, 2 s). */
  nodeServes(id: string): Promise<boolean>;
  killNode(id: string): Promise<void>;
  restartNode(id: string): Promise<void>;
  /** Drops every packet through node `id`'s link onto the cluster (in and out). */
  cut(id: string): Promise<void>;
  heal(id: string): Promise<void>;
  /** Limits what node `id` sends onto the cluster to `mbit` Mbit/s (tc tbf on its link). */
  throttle(id: string, mbit: number): Promise<void>;
  unthrottle(id: string): Promise<void>;
  /** Node `id`'s network namespace and its address there. */
  netns(id: string): { netns: string; address: string };
  /** Runs `cmd` in node `id`'s network namespace (as a process on that host would). */
  inNode(id: string, cmd: string, args: string[]): Promise<{ stdout: string; stderr: string }>;
  /** etcdctl against every member (or `endpoints`), from the root namespace. */
  etcdctl(args: string[], endpoints?: string[]): Promise<string>;
  /** The member that leads now (null: none answers as leader). */
  etcdLeader(): Promise<string | null>;
  killEtcd(name: string): Promise<void>;
  restartEtcd(name: string): Promise<void>;
  killGateway(name: string): Promise<void>;
  restartGateway(name: string): Promise<void>;
  /** Removes the cluster (not one given by FORKD_IT_CLUSTER_DIR). */
  down(): Promise<void>;
}

export interface ClusterOptions {
  nodes?: number;
  gateways?: number;
  etcdMembers?: number;
  /** Settings for every node and gateway besides FORKD_ACCEL (tcg unless set). */
  settings?: Record<string, string>;
  timeouts?: UpOptions["timeouts"];
}

export async function startCluster(o: ClusterOptions = {}): Promise<TestCluster> {
  const shared = process.env.FORKD_IT_CLUSTER_DIR;
  let st: ClusterState;
  if (shared) {
    const found = await readState(shared);
    if (!found || found.phase !== "up")
      throw new Error(`FORKD_IT_CLUSTER_DIR=${shared}: no cluster up there`);
    const want = { nodes: o.nodes ?? 3, gateways: o.gateways ?? 2, etcd: o.etcdMembers ?? 3 };
    const have = { nodes: found.nodes.length, gateways: found.gateways.length, etcd: found.etcd.length };
    if (want.nodes > have.nodes || want.gateways > have.gateways || want.etcd > have.etcd)
      throw new Error(
        `the shared cluster has ${JSON.stringify(have)}; this test needs ${JSON.stringify(want)}`,
      );
    st = found;
  } else {
    const dir = await mkdtemp(join(tmpdir(), "forkd-it-cluster-"));
    await up({
      nodes: o.nodes ?? 3,
      gateways: o.gateways ?? 2,
      etcdMembers: o.etcdMembers ?? 3,
      dir,
      settings: { FORKD_ACCEL: process.env.FORKD_ACCEL ?? "tcg", ...o.settings },
      ...(o.timeouts ? { timeouts: o.timeouts } : {}),
      keepOnFailure: false,
    });
    const made = await readState(dir);
    if (!made) throw new Error(`no record in ${dir} after up`);
    st = made;
  }
  const nodeOf = (id: string) => {
    const n = st.nodes.find((x) => x.id === id);
    if (!n) throw new Error(`no node ${id}`);
    return n;
  };
  const nft = (id: string, script: string) => inNetns(memberNetns(st.id, id), "nft", ["-f", "-"], script);
  const etcdctl = async (args: string[], endpoints = st.etcd.map((e) => e.clientUrl)) =>
    (
      await run(
        "etcdctl",
        [`--endpoints=${endpoints.join(",")}`, "--dial-timeout=2s", "--command-timeout=5s", ...args],
        { env: { ...process.env, ETCDCTL_API: "3" }, timeout: 15_000 },
      )
    ).stdout;
  const c: TestCluster = {
    info: describeCluster(st),
    st,
    token: st.token,
    node: (id) => ({ url: nodeOf(id).url, token: st.token }),
    gateway: (name) => {
      const g = st.gateways.find((x) => x.name === name);
      if (!g) throw new Error(`no gateway ${name}`);
      return { url: g.url, token: st.token };
    },
    nodeServes: async (id) => (await probe(`${nodeOf(id).url}/v1/health`, st.token)) === null,
    killNode: (id) => stopProc(st, nodeOf(id).id, "SIGKILL"),
    restartNode: async (id) => void (await restartProc(st, nodeOf(id).id)),
    cut: async (id) => {
      await nft(
        id,
        `table inet ${CUT_TABLE} {\n` +
          `  chain cut_in { type filter hook input priority -500; policy accept; iifname "${MEMBER_IF}" drop; }\n` +
          `  chain cut_fwd { type filter hook forward priority -500; policy accept; iifname "${MEMBER_IF}" drop; oifname "${MEMBER_IF}" drop; }\n` +
          `  chain cut_out { type filter hook output priority -500; policy accept; oifname "${MEMBER_IF}" drop; }\n` +
          `}\n`,
      );
    },
    heal: async (id) => {
      await nft(id, `add table inet ${CUT_TABLE}\ndelete table inet ${CUT_TABLE}\n`);
    },
    throttle: async (id, mbit) => {
      await inNetns(memberNetns(st.id, id), "tc", [
        "qdisc",
        "replace",
        "dev",
        MEMBER_IF,
        "root",
        "tbf",
        "rate",
        `${mbit}mbit`,
        "burst",
        "64kb",
        "latency",
        "400ms",
      ]);
    },
    unthrottle: async (id) => {
      await inNetns(memberNetns(st.id, id), "tc", ["qdisc", "del", "dev", MEMBER_IF, "root"]).catch(
        () => undefined,
      );
    },
    netns: (id) => ({ netns: memberNetns(st.id, id), address: new URL(nodeOf(id).url).hostname }),
    inNode: async (id, cmd, args) => {
      const r = await inNetns(memberNetns(st.id, id), cmd, args);
      return { stdout: r.stdout, stderr: r.stderr };
    },
    etcdctl,
    etcdLeader: async () => {
      for (const e of st.etcd) {
        if (!(await running(procOf(st, e.name)))) continue;
        // simple: endpoint, id, version, db size, is leader, ...
        const line = await etcdctl(["endpoint", "status", "-w", "simple"], [e.clientUrl]).catch(() => "");
        if (line.split(",").map((f) => f.trim())[4] === "true") return e.name;
      }
      return null;
    },
    killEtcd: (name) => stopProc(st, procOf(st, name).name, "SIGKILL"),
    restartEtcd: async (name) => void (await restartProc(st, procOf(st, name).name)),
    killGateway: (name) => stopProc(st, procOf(st, name).name, "SIGKILL"),
    restartGateway: async (name) => void (await restartProc(st, procOf(st, name).name)),
    down: async () => {
      if (shared) return;
      await down(st.dir);
    },
  };
  return c;
}
