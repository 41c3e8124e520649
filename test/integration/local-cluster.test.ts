/**
 * A real cluster on this machine (src/localcluster through test/helpers/cluster.ts): three etcd
 * members and three forkd nodes, each in a network namespace of its own with its own address,
 * data directory and image cache (no gateway yet). Each node serves its REST API on its address,
 * reached from the root namespace; node 1 snapshots and forks a real VM in its namespace and,
 * killed -9 and started again, re-adopts it; etcd elects a new leader when its leader is killed
 * and keeps what was written; a node cut off the network is unreachable, and reachable once
 * healed; and `down` leaves no process, namespace, link, table, marker or file behind.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readdir, readlink, stat } from "node:fs/promises";
import { spawn } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inNetns, listNetns, listRootLinks, NETNS_DIR, stillMade } from "../../src/localcluster/host-net.js";
import { rootLink } from "../../src/localcluster/layout.js";
import { procOf, readState } from "../../src/localcluster/state.js";
import type { ClusterState } from "../../src/localcluster/state.js";
import { clusterProcesses } from "../../src/localcluster/sweep.js";
import { down } from "../../src/localcluster/down.js";
import { startCluster } from "../helpers/cluster.js";
import type { TestCluster } from "../helpers/cluster.js";
import { apiRequest } from "../helpers/http.js";
import { CLI } from "../helpers/daemon.js";
import { isAlive } from "../../src/util/proc.js";
import { readFile } from "node:fs/promises";

const ROOT = process.getuid?.() === 0;
const NODES = ["n1", "n2", "n3"];
let c: TestCluster | undefined;
/** A child of node 1 left running for `down` to remove (its VMM's pid). */
let leftVmm: number | null = null;

const cluster = (): TestCluster => {
  if (!c) throw new Error("no cluster");
  return c;
};

async function until<T>(
  what: string,
  ms: number,
  f: () => Promise<T | null | undefined | false>,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== null && v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

before(async () => {
  if (!ROOT) return;
  const t0 = Date.now();
  // No hot pool: one snapshot forked once under TCG needs no warm members burning the CPU.
  c = await startCluster({ nodes: 3, gateways: 0, etcdMembers: 3, settings: { FORKD_POOL_SIZE: "0" } });
  process.stderr.write(`local cluster ${c.st.id} up in ${Date.now() - t0} ms\n`);
});

after(async () => {
  // Whatever a failed test left (down is idempotent: nothing to do after the last test's).
  if (c) await c.down();
});

test(
  "each node serves its API on its own address, from a namespace, data dir and cache of its own",
  { skip: !ROOT },
  async () => {
    const cl = cluster();
    const addrs = new Set<string>();
    for (const id of NODES) {
      const h = await apiRequest<{ ok: boolean }>(cl.node(id), "GET", "/v1/health", undefined, 10_000);
      assert.equal(h.ok, true, id);
      const n = cl.st.nodes.find((x) => x.id === id);
      assert.ok(n);
      addrs.add(n.addr);
      // The daemon runs in its node's namespace (the one bound at /run/netns/<ns>).
      const p = procOf(cl.st, id);
      assert.ok(p.pid !== null && p.netns !== null);
      const ns = await stat(join(NETNS_DIR, p.netns));
      assert.equal(await readlink(`/proc/${p.pid}/ns/net`), `net:[${ns.ino}]`, id);
      // Its /sys is its namespace's (src/localcluster/launch.ts): its own slots' links, not the root's.
      const links = await readdir(`/proc/${p.pid}/root/sys/class/net`);
      assert.ok(
        links.includes("eth0") && links.some((l) => l.startsWith(`fk${n.netId}h`)),
        `${id}: ${links.join(" ")}`,
      );
      assert.ok(!links.includes(rootLink(cl.st.id)), `${id} sees the root namespace's links`);
      // ...and the host's cgroup hierarchies under it (per-sandbox limits).
      assert.ok((await readdir(`/proc/${p.pid}/root/sys/fs/cgroup`)).length > 0, `${id} has no cgroups`);
    }
    assert.equal(addrs.size, 3);
    const [n1, n2, n3] = cl.st.nodes;
    assert.ok(n1 && n2 && n3);
    assert.equal(n1.cacheDir, "/var/cache/forkd");
    for (const n of [n2, n3]) {
      assert.ok(n.cacheDir.startsWith(cl.st.dir + "/"), n.cacheDir);
      assert.deepEqual(
        await readdir(join(n.cacheDir, "images")).catch(() => []),
        [],
        `${n.id} holds no image`,
      );
    }
    assert.equal(new Set(cl.st.nodes.map((n) => n.dataDir)).size, 3);
  },
);

test(
  "node 1 snapshots and forks a VM in its namespace; killed -9 and restarted, it re-adopts the child",
  { skip: !ROOT },
  async () => {
    const cl = cluster();
    const ep = cl.node("n1");
    await apiRequest(ep, "POST", "/v1/snapshots", { tag: "lc", memory_mib: 256 }, 600_000);
    const forked = await apiRequest<{ sandboxes: { id: string; pid: number; state: string }[] }>(
      ep,
      "POST",
      "/v1/sandboxes",
      { snapshot_tag: "lc", n: 1 },
      300_000,
    );
    const sb = forked.sandboxes[0];
    assert.ok(sb);
    assert.equal(sb.state, "running");
    const exec = (id: string) =>
      apiRequest<{ exit_code: number; stdout: string }>(
        ep,
        "POST",
        `/v1/sandboxes/${id}/exec`,
        { cmd: "echo hi-$((6*7))" },
        120_000,
      );
    assert.equal((await exec(sb.id)).stdout, "hi-42\n");

    await cl.killNode("n1");
    assert.equal(await cl.nodeServes("n1"), false);
    assert.ok(isAlive(sb.pid), "the child's VMM outlives its node");
    await cl.restartNode("n1");
    const v = await apiRequest<{ state: string; pid: number }>(
      ep,
      "GET",
      `/v1/sandboxes/${sb.id}`,
      undefined,
      10_000,
    );
    assert.equal(v.state, "running");
    assert.equal(v.pid, sb.pid);
    assert.equal((await exec(sb.id)).stdout, "hi-42\n");
    leftVmm = sb.pid; // left running: `down` must remove it
  },
);

test(
  "etcd has a leader; killed, a new one is elected and nothing written is lost",
  { skip: !ROOT },
  async () => {
    const cl = cluster();
    const leader = await until("a leader", 10_000, () => cl.etcdLeader());
    await cl.etcdctl(["put", "/lc/k", "before"]);
    const t0 = Date.now();
    await cl.killEtcd(leader);
    const next = await until("a new leader", 15_000, async () => {
      const l = await cl.etcdLeader();
      return l !== leader ? l : null;
    });
    process.stderr.write(`etcd: ${leader} killed, ${next} leads after ${Date.now() - t0} ms\n`);
    assert.notEqual(next, leader);
    await cl.etcdctl(["put", "/lc/k", "after"]);
    assert.equal((await cl.etcdctl(["get", "/lc/k", "--print-value-only"])).trim(), "after");
    await cl.restartEtcd(leader);
    const back = cl.st.etcd.find((e) => e.name === leader);
    assert.ok(back);
    // The restarted member caught up: a linearizable read through it alone sees the last write.
    const seen = await until("the restarted member serves the last write", 15_000, async () => {
      const v = await cl.etcdctl(["get", "/lc/k", "--print-value-only"], [back.clientUrl]).catch(() => "");
      return v.trim() === "after" ? v.trim() : null;
    });
    assert.equal(seen, "after");
  },
);

test(
  "a node cut off the network is unreachable (and reaches no etcd member); healed, it is reachable",
  { skip: !ROOT },
  async () => {
    const cl = cluster();
    assert.equal(await cl.nodeServes("n2"), true);
    await cl.cut("n2");
    try {
      assert.equal(await cl.nodeServes("n2"), false);
      const ns = procOf(cl.st, "n2").netns;
      assert.ok(ns);
      const endpoints = cl.st.etcd.map((e) => e.clientUrl).join(",");
      await assert.rejects(
        inNetns(ns, "etcdctl", [
          `--endpoints=${endpoints}`,
          "--dial-timeout=1s",
          "--command-timeout=2s",
          "get",
          "/lc/k",
        ]),
      );
      // The other nodes are not affected.
      assert.equal(await cl.nodeServes("n3"), true);
    } finally {
      await cl.heal("n2");
    }
    await until("n2 reachable after heal", 10_000, () => cl.nodeServes("n2"));
  },
);

test(
  "a `forkd cluster up` killed midway leaves a record from which down removes all it made (beside another cluster)",
  { skip: !ROOT },
  async () => {
    const dir = await mkdtemp(join(tmpdir(), "forkd-it-cluster-crash-"));
    const up = spawn(
      process.execPath,
      [CLI, "cluster", "up", "--nodes", "2", "--gateways", "0", "--dir", dir],
      {
        env: { ...process.env, FORKD_ACCEL: process.env.FORKD_ACCEL ?? "tcg" },
        stdio: "ignore",
      },
    );
    const exited = new Promise((r) => up.once("exit", r));
    // Killed once the second node's spec is recorded: namespaces, etcd members and a node are made.
    const st = await until("up records its second node", 60_000, async () => {
      const s = await readState(dir).catch(() => null);
      return s && s.procs.some((p) => p.name === "n2") ? s : null;
    });
    up.kill("SIGKILL");
    await exited;
    const recorded = (await readState(dir)) ?? st;
    assert.equal(recorded.phase, "starting");
    assert.notEqual(recorded.id, cluster().st.id, "two clusters, two ids");
    assert.notEqual(recorded.k, cluster().st.k, "two clusters, two subnets");
    const pids = [
      ...(await clusterProcesses(recorded)),
      ...recorded.procs.flatMap((p) => (p.pid ? [p.pid] : [])),
    ];
    assert.ok(pids.length >= 3, `its etcd members and node run on: ${pids.length}`);

    await down(dir);
    assert.deepEqual(pids.filter(isAlive), []);
    assert.deepEqual(await stillMade(recorded.made), []);
    assert.deepEqual(
      (await listNetns()).filter((n) => n.includes(recorded.id)),
      [],
    );
    await assert.rejects(stat(dir), { code: "ENOENT" });
    // The other cluster is untouched.
    for (const id of NODES) assert.equal(await cluster().nodeServes(id), true, id);
  },
);

test(
  "down removes every process, namespace, link, table, marker and file the cluster made",
  { skip: !ROOT },
  async () => {
    const cl = cluster();
    const st: ClusterState = cl.st;
    const record = await readState(st.dir);
    assert.ok(record);
    const pids = [...(await clusterProcesses(st)), ...st.procs.flatMap((p) => (p.pid ? [p.pid] : []))];
    assert.ok(pids.length >= 6, `processes found: ${pids.length}`);
    if (leftVmm !== null) assert.ok(pids.includes(leftVmm), "the child's VMM is found as the cluster's");
    const netIds = st.nodes.map((n) => n.netId);
    const forkdNs = (await listNetns()).filter((n) => netIds.some((id) => n.startsWith(`forkd-${id}-`)));
    assert.ok(forkdNs.length > 0, "the nodes made slot namespaces");

    // The per-sandbox cgroups of the child left running (a killed node never removes them).
    const cgroups: string[] = [];
    if (leftVmm !== null)
      for (const m of (await readFile(`/proc/${leftVmm}/cgroup`, "utf8")).matchAll(
        /^\d+:([^:,]*)[^:]*:(\/forkd\/[a-z0-9-]+)$/gm,
      ))
        cgroups.push(join("/sys/fs/cgroup", m[1] || "unified", m[2] ?? ""));
    assert.ok(leftVmm === null || cgroups.length > 0, "the child runs in cgroups of its own");

    await down(st.dir);
    c = undefined;

    const alive = pids.filter(isAlive);
    const what = async (pid: number) =>
      `${pid}: ${await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "?")} ${(await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "?")).replace(/\0/g, " ")}`;
    assert.deepEqual(alive, [], `processes left:\n${(await Promise.all(alive.map(what))).join("\n")}`);
    assert.deepEqual(await stillMade(st.made), []);
    const nsNow = await listNetns();
    assert.deepEqual(
      nsNow.filter((n) => n.includes(st.id) || forkdNs.includes(n)),
      [],
    );
    assert.deepEqual(
      (await listRootLinks()).filter((l) => l.includes(st.id)),
      [],
    );
    for (const id of netIds) await assert.rejects(stat(join("/run/forkd/net", id)), { code: "ENOENT" });
    await assert.rejects(stat(st.dir), { code: "ENOENT" });
    for (const d of cgroups) await assert.rejects(stat(d), { code: "ENOENT" }, d);
    // Again: nothing to do.
    assert.deepEqual(await down(st.dir), { found: false, id: null });
  },
);
