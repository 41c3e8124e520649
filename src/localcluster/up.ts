/**
 * `up`: a real forkd cluster on this machine. In order, each thing recorded before it is made:
 * the hub and the root link, the NAT table, a namespace per etcd member and per node; the etcd
 * members (waited for until each has a leader), the nodes (each until GET /v1/health answers on
 * its address), the gateways (on loopback ports of the root namespace). Every wait is bounded;
 * a failure names the process and shows its log's tail, and (unless asked to keep it) removes
 * everything made so far (./down.ts).
 */
import { mkdir, readdir } from "node:fs/promises";
import { createServer } from "node:net";
import { join, resolve } from "node:path";
import { ForkdError, errorMessage } from "../util/index.js";
import { freeNetIds, freeSubnet, makeHub, makeMember, makeNat } from "./host-net.js";
import {
  checkSizes,
  etcdAddr,
  etcdClientUrl,
  etcdName,
  newClusterId,
  nodeAddr,
  nodeE2bUrl,
  nodeName,
  nodeUrl,
} from "./layout.js";
import { DEFAULT_TIMEOUTS, startProc, timeoutOf } from "./processes.js";
import type { ServeTimeouts } from "./processes.js";
import { newAdminToken, writeClusterSecret } from "./secrets.js";
import { DEFAULT_CLI, etcdProc, gatewayProc, nodeProc } from "./specs.js";
import type { EtcdTuning } from "./specs.js";
import { readState, recordMade, writeState } from "./state.js";
import type { ClusterState } from "./state.js";
import { waitServing } from "./waits.js";
import { down } from "./down.js";
import { describe } from "./describe.js";
import type { ClusterInfo } from "./describe.js";

/** The shared guest image cache node 1 uses by default (images are built there already). */
export const DEFAULT_CACHE = "/var/cache/forkd";

export interface UpOptions {
  nodes: number;
  /** Gateways (`forkd gateway`), default 1; 0 starts none (clients then reach node n1). */
  gateways?: number;
  /** etcd members, default 3. */
  etcdMembers?: number;
  /** The cluster's directory (state, logs, data dirs): created; must be absent or empty. */
  dir: string;
  /**
   * Node i's image cache is cacheDirs[i-1]; default: node 1 the shared /var/cache/forkd, every
   * other node an empty cache of its own under `dir` (so images reach it through the cluster).
   */
  cacheDirs?: string[];
  /** Settings (FORKD_*) for every node and gateway, e.g. FORKD_ACCEL (see inheritedSettings). */
  settings?: Record<string, string>;
  /** The environment PATH, proxies... are taken from (default: this process's). */
  from?: NodeJS.ProcessEnv;
  /** The /24 to use: 10.240.<subnet>.0/24 (default: a free one). */
  subnet?: number;
  etcd?: EtcdTuning;
  /** The CLI a node or gateway runs (default: this build's dist/src/cli/main.js). */
  cli?: string;
  timeouts?: Partial<ServeTimeouts>;
  /** On failure, leave what was made for `down` (and its logs to read) instead of removing it. */
  keepOnFailure?: boolean;
  /** Progress lines. */
  say?: (line: string) => void;
}

const secs = (t0: number): string => ((Date.now() - t0) / 1000).toFixed(1);

async function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      const port = a && typeof a === "object" ? a.port : 0;
      s.close(() => res(port));
    });
  });
}

export async function up(o: UpOptions): Promise<ClusterInfo> {
  const t0 = Date.now();
  const gateways = o.gateways ?? 1;
  const members = o.etcdMembers ?? 3;
  checkSizes({ nodes: o.nodes, gateways, etcdMembers: members });
  if (process.getuid?.() !== 0)
    throw new ForkdError("invalid_argument", "a local cluster needs root (network namespaces, nftables)");
  const dir = resolve(o.dir);
  if (await readState(dir))
    throw new ForkdError(
      "conflict",
      `a cluster is recorded in ${dir} already: \`forkd cluster down --dir ${dir}\` first`,
    );
  await mkdir(dir, { recursive: true, mode: 0o700 });
  if ((await readdir(dir)).length > 0)
    throw new ForkdError("invalid_argument", `${dir} is not empty: a cluster's directory is its own`);
  const say = o.say ?? (() => undefined);
  const from = o.from ?? process.env;
  const timeouts = { ...DEFAULT_TIMEOUTS, ...o.timeouts };
  const cli = o.cli ?? DEFAULT_CLI;
  const settings = o.settings ?? {};

  const id = newClusterId();
  const k = await freeSubnet(o.subnet);
  const netIds = await freeNetIds(o.nodes);
  const st: ClusterState = {
    format: 1,
    id,
    dir,
    k,
    created: new Date().toISOString(),
    phase: "starting",
    token: newAdminToken(),
    secretFile: join(dir, "cluster-secret"),
    etcd: Array.from({ length: members }, (_, j) => ({
      name: etcdName(j + 1),
      addr: etcdAddr(k, j + 1),
      clientUrl: etcdClientUrl(k, j + 1),
      dataDir: join(dir, "etcd", etcdName(j + 1)),
    })),
    nodes: Array.from({ length: o.nodes }, (_, j) => ({
      id: nodeName(j + 1),
      addr: nodeAddr(k, j + 1),
      url: nodeUrl(k, j + 1),
      e2bUrl: nodeE2bUrl(k, j + 1),
      dataDir: join(dir, "nodes", nodeName(j + 1), "data"),
      cacheDir: o.cacheDirs?.[j] ?? (j === 0 ? DEFAULT_CACHE : join(dir, "nodes", nodeName(j + 1), "cache")),
      netId: netIds[j] as string,
    })),
    gateways: [],
    made: [],
    procs: [],
  };
  for (let i = 1; i <= gateways; i++) {
    st.gateways.push({
      name: `g${i}`,
      url: `http://127.0.0.1:${await freePort()}`,
      e2bUrl: `http://127.0.0.1:${await freePort()}`,
    });
  }
  await writeState(st);
  try {
    await writeClusterSecret(st.secretFile);
    say(`cluster ${id}: network 10.240.${k}.0/24`);
    await makeHub(st);
    await makeNat(st);
    for (const e of st.etcd) await makeMember(st, e.name, e.addr);
    for (const n of st.nodes) await makeMember(st, n.id, n.addr);
    for (const n of st.nodes) await mkdir(n.cacheDir, { recursive: true, mode: 0o755 });

    say(`starting ${members} etcd member(s)`);
    for (let i = 1; i <= members; i++) await startProc(st, etcdProc(st, i, members, o.etcd ?? {}, from));
    await waitAll(st, "etcd", timeouts);
    say(`etcd has a leader (${secs(t0)} s)`);

    say(`starting ${o.nodes} node(s)`);
    for (let i = 1; i <= o.nodes; i++) {
      const n = st.nodes[i - 1];
      if (n) await recordMade(st, { kind: "netid", id: n.netId });
      await startProc(st, nodeProc(st, i, { cli, settings, from }));
    }
    await waitAll(st, "node", timeouts);
    say(`nodes serve (${secs(t0)} s)`);

    if (gateways > 0) {
      say(`starting ${gateways} gateway(s)`);
      for (let i = 1; i <= gateways; i++) await startProc(st, gatewayProc(st, i, { cli, settings, from }));
      await waitAll(st, "gateway", timeouts);
    }
    st.phase = "up";
    await writeState(st);
  } catch (e) {
    st.phase = "failed";
    await writeState(st).catch(() => undefined);
    if (o.keepOnFailure) {
      throw new ForkdError(
        "unavailable",
        `${errorMessage(e)}\n(the cluster's state is kept in ${dir}: forkd cluster down --dir ${dir})`,
      );
    }
    await down(dir).catch((d: unknown) => say(`removing the failed cluster: ${errorMessage(d)}`));
    if (/unknown command 'gateway'/.test(errorMessage(e)))
      throw new ForkdError(
        "unavailable",
        `${errorMessage(e)}\n(this build has no \`forkd gateway\`: --gateways 0 starts none)`,
      );
    throw e;
  }
  say(`cluster ${id} up in ${secs(t0)} s`);
  return describe(st, Date.now() - t0);
}

/** Waits until every process of `role` serves (in parallel, each bounded). */
async function waitAll(st: ClusterState, role: string, t: ServeTimeouts): Promise<void> {
  const ps = st.procs.filter((p) => p.role === role);
  const results = await Promise.allSettled(ps.map((p) => waitServing(p, st.token, timeoutOf(p, t))));
  const failed = results.flatMap((r) => (r.status === "rejected" ? [errorMessage(r.reason)] : []));
  if (failed.length > 0) throw new ForkdError("unavailable", failed.join("\n"));
}
