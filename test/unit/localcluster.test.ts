/**
 * The local cluster's pure parts (src/localcluster): names and addresses, what each process runs
 * with (the cluster settings of docs/cluster.md on every node, the gateways' contract, etcd's
 * static cluster), the settings a caller's environment passes on, the secrets, the record's
 * checks, the client exports, and `down` on a directory holding no cluster. The real cluster is
 * test/integration/cluster.test.ts.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, mkdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { weakTokenReason } from "../../src/access/tokens.js";
import {
  checkSizes,
  clusterEnvValue,
  etcdAddr,
  memberNetns,
  newClusterId,
  nodeAddr,
  rootLink,
  CLUSTER_ID_RE,
} from "../../src/localcluster/layout.js";
import { etcdProc, gatewayProc, inheritedSettings, nodeProc } from "../../src/localcluster/specs.js";
import { newAdminToken, writeClusterSecret } from "../../src/localcluster/secrets.js";
import { procOf, readState, writeState } from "../../src/localcluster/state.js";
import type { ClusterState } from "../../src/localcluster/state.js";
import { clientEnv, exportLines } from "../../src/localcluster/describe.js";
import { down } from "../../src/localcluster/down.js";
import { commandOf, running } from "../../src/localcluster/launch.js";
import { restartProc, startProc, stopProc } from "../../src/localcluster/processes.js";
import { clusterProcesses } from "../../src/localcluster/sweep.js";
import { probe, waitServing } from "../../src/localcluster/waits.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { isAlive } from "../../src/util/proc.js";
import { createServer } from "node:net";

const cluster = (dir: string, gateways = 2): ClusterState => ({
  format: 1,
  id: "ab12cd",
  dir,
  k: 7,
  created: new Date().toISOString(),
  phase: "up",
  token: newAdminToken(),
  secretFile: join(dir, "cluster-secret"),
  etcd: [1, 2, 3].map((i) => ({
    name: `e${i}`,
    addr: etcdAddr(7, i),
    clientUrl: `http://${etcdAddr(7, i)}:2379`,
    dataDir: join(dir, "etcd", `e${i}`),
  })),
  nodes: [1, 2].map((i) => ({
    id: `n${i}`,
    addr: nodeAddr(7, i),
    url: `http://${nodeAddr(7, i)}:7070`,
    e2bUrl: `http://${nodeAddr(7, i)}:3000`,
    dataDir: join(dir, "nodes", `n${i}`, "data"),
    cacheDir: i === 1 ? "/var/cache/forkd" : join(dir, "nodes", `n${i}`, "cache"),
    netId: i === 1 ? "0a0b" : "0c0d",
  })),
  gateways: Array.from({ length: gateways }, (_, j) => ({
    name: `g${j + 1}`,
    url: `http://127.0.0.1:${4000 + j}`,
    e2bUrl: `http://127.0.0.1:${5000 + j}`,
  })),
  made: [],
  procs: [],
});

test("names fit the kernel's limits, stay apart from forkd's own, and addresses are distinct", () => {
  for (let i = 0; i < 50; i++) assert.match(newClusterId(), CLUSTER_ID_RE);
  const cid = newClusterId();
  assert.ok(rootLink(cid).length <= 15, "an interface name has at most 15 characters");
  assert.doesNotMatch(rootLink(cid), /^fk[0-9a-f]{4}h/, "never a forkd slot's host link");
  assert.doesNotMatch(memberNetns(cid, "n1"), /^forkd-/);
  const addrs = [...[1, 2, 3, 9].map((i) => etcdAddr(7, i)), ...[1, 2, 150].map((i) => nodeAddr(7, i))];
  assert.equal(new Set(addrs).size, addrs.length);
  for (const a of addrs) assert.match(a, /^10\.240\.7\.(\d+)$/);
  assert.equal(nodeAddr(7, 150), "10.240.7.250");
  assert.equal(clusterEnvValue(7, 3), "etcd://10.240.7.11:2379,10.240.7.12:2379,10.240.7.13:2379");
  assert.throws(() => checkSizes({ nodes: 0, gateways: 1, etcdMembers: 3 }), /nodes/);
  assert.throws(() => checkSizes({ nodes: 151, gateways: 1, etcdMembers: 3 }), /nodes/);
  assert.throws(() => checkSizes({ nodes: 1, gateways: 1, etcdMembers: 10 }), /etcd/);
  checkSizes({ nodes: 3, gateways: 0, etcdMembers: 1 });
});

test("a node runs `forkd daemon` in its namespace with the cluster settings, its own dirs and the admin token", () => {
  const st = cluster("/c");
  const from = { PATH: "/usr/bin:/bin", HOME: "/root", FORKD_TOKEN: "caller-token" };
  const p = nodeProc(st, 2, {
    cli: "/x/main.js",
    settings: { FORKD_ACCEL: "tcg", FORKD_DATA_DIR: "/nope" },
    from,
  });
  assert.deepEqual(p.argv.slice(1), ["/x/main.js", "daemon"]);
  assert.equal(p.netns, "fkcl-ab12cd-n2");
  assert.equal(p.sysfs, true);
  assert.deepEqual(
    {
      data: p.env.FORKD_DATA_DIR,
      cache: p.env.FORKD_CACHE_DIR,
      listen: p.env.FORKD_LISTEN,
      e2b: p.env.FORKD_E2B_LISTEN,
      token: p.env.FORKD_TOKEN,
      cluster: p.env.FORKD_CLUSTER,
      id: p.env.FORKD_NODE_ID,
      addr: p.env.FORKD_NODE_ADDR,
      e2bAddr: p.env.FORKD_NODE_E2B_ADDR,
      secret: p.env.FORKD_CLUSTER_SECRET_FILE,
      netId: p.env.FORKD_NET_ID,
      accel: p.env.FORKD_ACCEL,
      marker: p.env.FORKD_LOCALCLUSTER,
    },
    {
      data: "/c/nodes/n2/data",
      cache: "/c/nodes/n2/cache",
      listen: "10.240.7.102:7070",
      e2b: "10.240.7.102:3000",
      token: st.token,
      cluster: "etcd://10.240.7.11:2379,10.240.7.12:2379,10.240.7.13:2379",
      id: "n2",
      addr: "http://10.240.7.102:7070",
      e2bAddr: "http://10.240.7.102:3000",
      secret: "/c/cluster-secret",
      netId: "0c0d",
      accel: "tcg",
      marker: "ab12cd",
    },
  );
  assert.equal(p.env.HOME, undefined, "only what programs need of the caller's environment");
  assert.equal(p.probe, "http://10.240.7.102:7070/v1/health");
  // In its namespace, with a /sys of its own, the program's pid being the daemon's (exec chain).
  const cmd = commandOf(p);
  assert.deepEqual(cmd.slice(0, 3), ["nsenter", "--net=/run/netns/fkcl-ab12cd-n2", "--"]);
  assert.deepEqual(cmd.slice(3, 8), ["unshare", "--mount", "--propagation", "unchanged", "--"]);
  assert.match(cmd[10] ?? "", /mount -t sysfs sysfs \/sys/);
  assert.deepEqual(cmd.slice(-3), [process.execPath, "/x/main.js", "daemon"]);
});

test("an etcd member is one of a static cluster, with short heartbeat and election; a gateway listens on loopback", () => {
  const st = cluster("/c");
  const e = etcdProc(st, 2, 3, {}, { PATH: "/bin" });
  assert.ok(
    e.argv.includes(
      "--initial-cluster=e1=http://10.240.7.11:2380,e2=http://10.240.7.12:2380,e3=http://10.240.7.13:2380",
    ),
  );
  assert.ok(e.argv.includes("--listen-client-urls=http://10.240.7.12:2379"));
  assert.ok(e.argv.includes("--heartbeat-interval=50") && e.argv.includes("--election-timeout=500"));
  assert.ok(e.argv.includes("--data-dir=/c/etcd/e2"));
  assert.deepEqual(commandOf(e).slice(0, 4), ["nsenter", "--net=/run/netns/fkcl-ab12cd-e2", "--", "etcd"]);
  const g = gatewayProc(st, 2, { cli: "/x/main.js", settings: {}, from: {} });
  assert.deepEqual(commandOf(g), [process.execPath, "/x/main.js", "gateway"]);
  assert.equal(g.env.FORKD_GATEWAY_LISTEN, "127.0.0.1:4001");
  assert.equal(g.env.FORKD_GATEWAY_E2B_LISTEN, "127.0.0.1:5001");
  assert.equal(g.env.FORKD_CLUSTER, clusterEnvValue(7, 3));
  assert.equal(g.env.FORKD_CLUSTER_SECRET_FILE, "/c/cluster-secret");
  assert.equal(g.env.FORKD_TOKEN, st.token);
});

test("a caller's settings pass to nodes and gateways, but not those the cluster sets or a client's", () => {
  const got = inheritedSettings({
    FORKD_ACCEL: "tcg",
    FORKD_POOL_SIZE: "0",
    FORKD_TOKEN: "t",
    FORKD_URL: "http://x",
    FORKD_DATA_DIR: "/d",
    FORKD_CLUSTER: "etcd://elsewhere:2379",
    FORKD_TEST_CRASH_AT: "fork:x",
    HOME: "/root",
  });
  assert.deepEqual(got, { FORKD_ACCEL: "tcg", FORKD_POOL_SIZE: "0" });
});

test("the admin token is a strong token and an E2B key; the cluster secret is 0600 and long enough", async () => {
  for (let i = 0; i < 20; i++) {
    const t = newAdminToken();
    assert.match(t, /^e2b_[0-9a-f]{64}$/);
    assert.equal(weakTokenReason(t), null);
  }
  const dir = await mkdtemp(join(tmpdir(), "lc-unit-"));
  try {
    await writeClusterSecret(join(dir, "s"));
    assert.equal((await stat(join(dir, "s"))).mode & 0o777, 0o600);
    assert.ok((await readFile(join(dir, "s"))).length >= 32);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("the record round-trips; a damaged one is refused, a missing one is none", async () => {
  const dir = await mkdtemp(join(tmpdir(), "lc-unit-"));
  try {
    assert.equal(await readState(dir), null);
    const st = cluster(dir);
    st.made.push({ kind: "netns", name: "fkcl-ab12cd-hub" }, { kind: "netid", id: "0a0b" });
    await writeState(st);
    assert.equal((await stat(join(dir, "cluster.json"))).mode & 0o777, 0o600);
    assert.deepEqual(await readState(dir), st);
    await writeFile(join(dir, "cluster.json"), "{");
    await assert.rejects(readState(dir), /not JSON/);
    await writeFile(
      join(dir, "cluster.json"),
      JSON.stringify({ ...st, made: [{ kind: "netns", name: "a b" }] }),
    );
    await assert.rejects(readState(dir), /not a local cluster's record/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("clients are pointed at the first gateway, or at node n1 without one", () => {
  const withGw = clientEnv(cluster("/c"));
  assert.equal(withGw.FORKD_URL, "http://127.0.0.1:4000");
  assert.equal(withGw.E2B_API_URL, "http://127.0.0.1:5000");
  assert.equal(withGw.E2B_SANDBOX_URL, "http://127.0.0.1:5000");
  assert.equal(withGw.E2B_API_KEY, withGw.FORKD_TOKEN);
  const none = clientEnv(cluster("/c", 0));
  assert.equal(none.FORKD_URL, "http://10.240.7.101:7070");
  assert.equal(none.E2B_API_URL, "http://10.240.7.101:3000");
  assert.deepEqual(exportLines({ A: "x y", B: "it's" }), ["export A='x y'", "export B='it'\\''s'"]);
});

test("down leaves a directory without a cluster record alone (an empty one is removed)", async () => {
  const dir = await mkdtemp(join(tmpdir(), "lc-unit-"));
  try {
    await mkdir(join(dir, "full"));
    await writeFile(join(dir, "full", "mine"), "x");
    assert.deepEqual(await down(join(dir, "full")), { found: false, id: null });
    assert.equal(await readFile(join(dir, "full", "mine"), "utf8"), "x");
    await mkdir(join(dir, "empty"));
    await down(join(dir, "empty"));
    await assert.rejects(stat(join(dir, "empty")), { code: "ENOENT" });
    assert.deepEqual(await down(join(dir, "absent")), { found: false, id: null });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("a gateway starts to its contract, is found by the cluster's marker, killed, restarted, and removed by down", async () => {
  const dir = await mkdtemp(join(tmpdir(), "lc-unit-"));
  const port = async () =>
    new Promise<number>((res) => {
      const s = createServer().listen(0, "127.0.0.1", () => {
        const a = s.address();
        s.close(() => res(a && typeof a === "object" ? a.port : 0));
      });
    });
  const st = cluster(dir, 0);
  st.gateways.push({
    name: "g1",
    url: `http://127.0.0.1:${await port()}`,
    e2bUrl: `http://127.0.0.1:${await port()}`,
  });
  await writeClusterSecret(st.secretFile);
  const cli = join(REPO_DIR, "dist/test/fakes/gateway-cli.js");
  try {
    const p = await startProc(st, gatewayProc(st, 1, { cli, settings: {}, from: process.env }));
    await waitServing(p, st.token, 10_000);
    assert.equal(await probe(`${st.gateways[0]?.e2bUrl ?? ""}/v1/health`, st.token), null);
    assert.deepEqual(await clusterProcesses(st), [p.pid], "found by its marker, nothing else");
    const first = p.pid;
    await stopProc(st, "g1", "SIGKILL");
    assert.equal(await running(procOf(st, "g1")), false);
    await restartProc(st, "g1");
    assert.notEqual(procOf(st, "g1").pid, first);
    assert.equal(await probe(procOf(st, "g1").probe, st.token), null);
    const pid = procOf(st, "g1").pid as number;
    await down(dir);
    assert.equal(isAlive(pid), false);
    await assert.rejects(stat(dir), { code: "ENOENT" });
  } finally {
    const left = await readState(dir).catch(() => null);
    for (const p of left?.procs ?? [])
      if (p.pid !== null && (await running(p))) process.kill(p.pid, "SIGKILL");
    await rm(dir, { recursive: true, force: true });
  }
});

test("a gateway that cannot start fails the wait with its name and its log's tail", async () => {
  const dir = await mkdtemp(join(tmpdir(), "lc-unit-"));
  const st = cluster(dir, 1);
  // The real `forkd gateway`: it checks its settings before it connects to anything.
  const cli = join(REPO_DIR, "dist/src/cli/main.js");
  try {
    // A cluster secret too short: the gateway refuses to start.
    await writeFile(st.secretFile, "short", { mode: 0o600 });
    const p = await startProc(st, gatewayProc(st, 1, { cli, settings: {}, from: process.env }));
    await assert.rejects(
      waitServing(p, st.token, 10_000),
      (e: Error) =>
        /gateway g1 exited before it served/.test(e.message) &&
        /holds 5 bytes; a cluster secret needs at least 32/.test(e.message),
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
