/**
 * One cluster size of the scale benchmark (bench/cluster-scale.ts): brings up etcd, N nodes
 * (fake VMMs, several per process; the last node alone in a process of its own, to be killed),
 * one gateway, all under one fresh directory; measures (placement rate, the gateway's added
 * latency, etcd's writes per create, the gateway's memory per sandbox, the time to mark a dead
 * node's sandboxes lost); stops everything and removes the directory.
 */
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BENCH_TAG } from "./cluster-fake-node.js";
import { countersSince, etcdCounters, isGauge } from "./cluster-etcd-metrics.js";
import type { EtcdCounters } from "./cluster-etcd-metrics.js";
import { request } from "./cluster-http.js";
import { cpuOf, cpuSince } from "./cluster-cpu.js";
import { createMany, latencyPair, timeToLost } from "./cluster-measure.js";
import type { CreateRun, LatencyPair, LostRun } from "./cluster-measure.js";
import { startEtcd, startGatewayProc, startNodeHost } from "./cluster-procs.js";
import type { Etcd, GatewayProc, NodeHost } from "./cluster-procs.js";
import { pct, r1, r2 } from "./stats.js";

export interface SizeOptions {
  nodes: number;
  sandboxes: number;
  etcdMembers: number;
  nodesPerProcess: number;
  concurrency: number;
  batch: number;
  batchConcurrency: number;
  latencySamples: number;
  createSamples: number;
  /** The nodes' settings (their per-caller limits). */
  nodeEnv: Record<string, string>;
  log: (s: string) => void;
}

export interface SizeResult {
  nodes: number;
  sandboxes: number;
  startS: number;
  singles: Omit<CreateRun, "requestMs"> & { p50Ms: number; p99Ms: number };
  batches: Omit<CreateRun, "requestMs"> & { p50Ms: number; p99Ms: number; batch: number };
  etcd: {
    /** Per second while idle (N nodes' keepalives and record refreshes, the gateway). */
    idlePerS: EtcdCounters;
    /** Per child created, over both create phases, idle rate not taken off. */
    perCreate: Record<keyof EtcdCounters, number>;
    /** At the end of the creates. */
    keys: number;
    watchers: number;
    dbMiB: number;
  };
  latency: LatencyPair[];
  /**
   * CPU ms per child created (one per request; in fork -n batches) and per GET relayed, by
   * component: the gateway, etcd, all node processes, the bench's client.
   */
  cpuMsPer: { single: Record<string, number>; batched: Record<string, number>; relayedGet: number };
  gatewayRssMiB: { before: number; after: number; perThousandSandboxes: number };
  lost: LostRun;
  spreadByNode: { min: number; max: number };
}

async function rssMiB(pid: number | undefined): Promise<number> {
  if (!pid) return NaN;
  const s = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  const kb = Number(/VmRSS:\s+(\d+)/.exec(s)?.[1] ?? NaN);
  return kb / 1024;
}

const summary = (r: CreateRun) => {
  const { requestMs, ...rest } = r;
  return {
    ...rest,
    perSecond: r1(r.perSecond),
    wallMs: r1(r.wallMs),
    p50Ms: r1(pct(requestMs, 50)),
    p99Ms: r1(pct(requestMs, 99)),
  };
};

export async function runSize(o: SizeOptions): Promise<SizeResult> {
  const dir = await mkdtemp(join(tmpdir(), `forkd-bench-cluster-${o.nodes}-`));
  const prefix = "/forkd-bench/";
  const adminToken = `e2b_${randomBytes(32).toString("hex")}`;
  const secretFile = join(dir, "cluster-secret");
  await writeFile(secretFile, randomBytes(48).toString("base64url"), { mode: 0o600 });
  let etcd: Etcd | null = null;
  const hosts: NodeHost[] = [];
  let gw: GatewayProc | null = null;
  const t0 = performance.now();
  try {
    o.log(`${o.nodes} nodes: etcd (${o.etcdMembers} member${o.etcdMembers > 1 ? "s" : ""})`);
    etcd = await startEtcd(dir, o.etcdMembers);
    const cluster = `etcd://${etcd.urls.map((u) => u.replace("http://", "")).join(",")}`;
    const ids = Array.from({ length: o.nodes }, (_, i) => `n${String(i + 1).padStart(3, "0")}`);
    const victim = ids[ids.length - 1] ?? "n001";
    const groups: string[][] = [];
    const rest = ids.slice(0, -1);
    for (let i = 0; i < rest.length; i += o.nodesPerProcess)
      groups.push(rest.slice(i, i + o.nodesPerProcess));
    groups.push([victim]);
    o.log(`  ${o.nodes} nodes in ${groups.length} processes`);
    const spec = { cluster, prefix, adminToken, maxSandboxes: 1000, env: o.nodeEnv };
    hosts.push(...(await Promise.all(groups.map((g) => startNodeHost(dir, { ...spec, ids: g })))));
    gw = await startGatewayProc(dir, "gateway", { cluster, prefix, secretFile, adminToken });
    // Every node in the gateway's view, the snapshot in the catalog.
    for (let i = 0; ; i++) {
      const n = await request<{ nodes?: unknown[] }>(gw.url, "GET", "/v1/nodes", { token: adminToken });
      const s = await request(gw.url, "GET", `/v1/snapshots/${BENCH_TAG}`, { token: adminToken });
      if (n.body.nodes?.length === o.nodes && s.status === 200) break;
      if (i > 600) throw new Error(`the gateway sees ${n.body.nodes?.length ?? 0} of ${o.nodes} nodes`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const startS = (performance.now() - t0) / 1000;
    o.log(`  up in ${r1(startS)} s; a tenant token`);
    const tok = await request<{ token: string }>(gw.url, "POST", "/v1/tokens", {
      token: adminToken,
      body: { tenant: "bench" },
    });
    if (tok.status !== 201) throw new Error(`token: ${tok.status} ${JSON.stringify(tok.body)}`);
    const token = tok.body.token;
    // The token reaches every node by its watch: wait until one answers with it.
    for (
      let i = 0;
      (await request(hosts[0]?.nodes[0]?.api ?? "", "GET", "/v1/sandboxes", { token })).status !== 200;
      i++
    ) {
      if (i > 100) throw new Error("the tenant's token did not reach the nodes");
      await new Promise((r) => setTimeout(r, 100));
    }

    const idle0 = await etcdCounters(etcd.urls);
    const idleMs = 3000;
    await new Promise((r) => setTimeout(r, idleMs));
    const idle1 = await etcdCounters(etcd.urls);
    const idle = countersSince(idle0, idle1);
    const idlePerS = Object.fromEntries(
      Object.entries(idle).map(([k, v]) => [k, isGauge(k) ? v : r1(v / (idleMs / 1000))]),
    ) as EtcdCounters;
    const rss0 = await rssMiB(gw.proc.proc.pid);

    const byNode = new Map<string, string[]>();
    const seen = (c: { id: string; node: string | null }) => {
      const k = c.node ?? "?";
      const l = byNode.get(k) ?? [];
      l.push(c.id);
      byNode.set(k, l);
    };
    const components = {
      gateway: [gw.proc.proc.pid],
      etcd: etcd.members.map((m) => m.proc.pid),
      nodes: hosts.map((h) => h.proc.proc.pid),
    };
    const per = (d: Record<string, number>, n: number) =>
      Object.fromEntries(Object.entries(d).map(([k, v]) => [k, r2(v / Math.max(1, n))]));
    const cpu0 = await cpuOf(components);
    const half = Math.floor(o.sandboxes / 2);
    o.log(`  ${half} creates of one child, ${o.concurrency} at once`);
    const singles = await createMany(gw.url, token, BENCH_TAG, half, {
      batch: 1,
      concurrency: o.concurrency,
      seen,
    });
    o.log(
      `    ${singles.created} in ${r1(singles.wallMs / 1000)} s: ${r1(singles.perSecond)}/s; ${singles.failed} failed ${singles.failures[0] ?? ""}`,
    );
    const cpu1 = await cpuOf(components);
    o.log(`  ${o.sandboxes - half} children in forks of ${o.batch}, ${o.batchConcurrency} at once`);
    const batches = await createMany(gw.url, token, BENCH_TAG, o.sandboxes - half, {
      batch: o.batch,
      concurrency: o.batchConcurrency,
      seen,
    });
    o.log(
      `    ${batches.created} in ${r1(batches.wallMs / 1000)} s: ${r1(batches.perSecond)}/s; ${batches.failed} failed ${batches.failures[0] ?? ""}`,
    );
    const cpu2 = await cpuOf(components);
    const after = await etcdCounters(etcd.urls);
    const created = singles.created + batches.created;
    const used = countersSince(idle1, after);
    const perCreate = Object.fromEntries(
      Object.entries(used).map(([k, v]) => [k, isGauge(k) ? v : r2(v / Math.max(1, created))]),
    ) as Record<keyof EtcdCounters, number>;
    // The mirrors settle (the last children's records reach the gateway's watch).
    await new Promise((r) => setTimeout(r, 1000));
    const rss1 = await rssMiB(gw.proc.proc.pid);

    // A node with sandboxes, not the one killed below.
    const probe = hosts[0]?.nodes.find((n) => (byNode.get(n.id)?.length ?? 0) > 0);
    if (!probe) throw new Error("no node got a sandbox");
    const paths = (byNode.get(probe.id) ?? []).slice(0, 50).map((id) => `/v1/sandboxes/${id}`);
    o.log(
      `  latency: GET a sandbox, ${o.latencySamples} through the gateway and ${o.latencySamples} direct to ${probe.id}`,
    );
    const gwCpu0 = await cpuOf({ gateway: components.gateway });
    const latency = [
      await latencyPair("GET /v1/sandboxes/{id}", gw.url, probe.api, token, paths, o.latencySamples),
    ];
    const gwCpu = cpuSince(gwCpu0, await cpuOf({ gateway: components.gateway })).gateway ?? NaN;
    if (o.createSamples > 0) {
      o.log(`  latency: create one child, ${o.createSamples} each way`);
      latency.push(
        await latencyPair(
          "POST /v1/sandboxes (one child)",
          gw.url,
          probe.api,
          token,
          ["/v1/sandboxes"],
          o.createSamples,
          "POST",
          {
            snapshot_tag: BENCH_TAG,
          },
        ),
      );
    }
    for (const l of latency)
      o.log(
        `    ${l.call}: gateway p50 ${r2(l.gateway.p50)} ms p99 ${r2(l.gateway.p99)}; direct p50 ${r2(l.direct.p50)} p99 ${r2(l.direct.p99)}`,
      );

    const victimIds = new Set(byNode.get(victim) ?? []);
    const victimHost = hosts[hosts.length - 1];
    if (!victimHost) throw new Error("no victim");
    o.log(`  SIGKILL of ${victim}'s process (${victimIds.size} sandboxes); polling the gateway`);
    const lost = await timeToLost(gw.url, adminToken, victim, victimIds, () => victimHost.proc.kill(), {
      everyMs: 100,
      boundMs: 60_000,
    });
    o.log(
      `    node gone from the view at ${lost.nodeGoneMs === null ? "?" : r1(lost.nodeGoneMs)} ms; all lost at ${lost.allLostMs === null ? "never" : r1(lost.allLostMs)} ms`,
    );
    const counts = [...byNode.entries()].filter(([k]) => k !== "?").map(([, v]) => v.length);
    return {
      nodes: o.nodes,
      sandboxes: created,
      startS: r1(startS),
      singles: summary(singles),
      batches: { ...summary(batches), batch: o.batch },
      etcd: {
        idlePerS,
        perCreate,
        keys: after.keys,
        watchers: after.watchers,
        dbMiB: r1(after.dbBytes / 2 ** 20),
      },
      latency: latency.map((l) => ({
        ...l,
        gateway: { p50: r2(l.gateway.p50), p99: r2(l.gateway.p99) },
        direct: { p50: r2(l.direct.p50), p99: r2(l.direct.p99) },
        added: { p50: r2(l.added.p50), p99: r2(l.added.p99) },
      })),
      cpuMsPer: {
        single: per(cpuSince(cpu0, cpu1), singles.created),
        batched: per(cpuSince(cpu1, cpu2), batches.created),
        relayedGet: r2(gwCpu / (o.latencySamples + 1)),
      },
      gatewayRssMiB: {
        before: r1(rss0),
        after: r1(rss1),
        perThousandSandboxes: r2(((rss1 - rss0) / Math.max(1, created)) * 1000),
      },
      lost: {
        ...lost,
        nodeGoneMs: lost.nodeGoneMs === null ? null : r1(lost.nodeGoneMs),
        firstLostMs: lost.firstLostMs === null ? null : r1(lost.firstLostMs),
        allLostMs: lost.allLostMs === null ? null : r1(lost.allLostMs),
      },
      spreadByNode: { min: Math.min(...counts), max: Math.max(...counts) },
    };
  } finally {
    o.log(`  stopping`);
    await gw?.proc.stop(10_000);
    await Promise.all(hosts.map((h) => h.proc.stop(60_000)));
    await Promise.all((etcd?.members ?? []).map((m) => m.stop(5_000)));
    if (process.env.FORKD_BENCH_KEEP) o.log(`  kept ${dir}`);
    else await rm(dir, { recursive: true, force: true });
  }
}
