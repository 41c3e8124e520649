/**
 * forkd across hosts, on this machine (issue 25's proof): three etcd members, three forkd nodes
 * each in a network namespace of its own with its own address, data dir and image cache (only
 * n1 holds guest images: n2 and n3 receive images and snapshots through the cluster), two
 * gateways, all real (test/helpers/cluster.ts), VMs real (TCG here).
 *
 * In order, on one cluster: each node serves from a namespace, data dir and cache of its own; a
 * fan-out of 30 through a gateway spreads over the three nodes and
 * each node pulls the snapshot once; a branch on one node forked on the others carries its
 * memory, disk and processes, and each node pulls about its diff only; forkd's TypeScript SDK and
 * E2B's SDK work unchanged through a gateway (create, commands, files, PTY, fork, pause/resume,
 * snapshots), and a tenant sees nothing of another's on any door, a revoked token nowhere; then
 * each fault: a node killed -9 (its sandboxes lost within a bound, new work elsewhere, a branch
 * only it held fetched from the registry it pushed it to, restarted: re-adopted, no duplicates), a node cut off the network (it refuses work it cannot record,
 * healed: it rejoins), the etcd leader killed (requests answer after the election, nothing
 * lost), a gateway killed (the other serves the same sandboxes at once), the peer serving a pull
 * killed mid-transfer (the pull resumes from another holder). Last, `forkd cluster up` killed
 * midway leaves a record `down` removes everything by (beside this cluster), and `down` of this
 * one, a sandbox left running, removes every process, namespace, link, table, marker and file.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtemp, readdir, readFile, readlink, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox as E2bSandbox } from "e2b";
import { Sandbox, fork as sdkFork } from "@forkd/sdk";
import { listNetns, listRootLinks, NETNS_DIR, stillMade } from "../../src/localcluster/host-net.js";
import { rootLink } from "../../src/localcluster/layout.js";
import { procOf, readState } from "../../src/localcluster/state.js";
import type { ClusterState } from "../../src/localcluster/state.js";
import { clusterProcesses } from "../../src/localcluster/sweep.js";
import { down } from "../../src/localcluster/down.js";
import { isAlive } from "../../src/util/proc.js";
import { CLI } from "../helpers/daemon.js";
import { startCluster } from "../helpers/cluster.js";
import type { TestCluster } from "../helpers/cluster.js";
import { ApiError, apiRequest, rawRequest, readAll } from "../helpers/http.js";
import type { Endpoint } from "../helpers/http.js";
import { parseMetrics, value } from "../helpers/prometheus.js";
import { startRegistry } from "../helpers/registry.js";
import { steps } from "../helpers/steps.js";

const ROOT = process.getuid?.() === 0;
const NODES = ["n1", "n2", "n3"] as const;
const BASE = "cl-base";
/** How long the cluster takes to call a dead node's sandboxes lost (lease 6 s + sweep): the bound. */
const LOST_WITHIN_MS = 20_000;

let c: TestCluster | undefined;
/** A child left running for `down` to remove (its VMM's pid). */
let leftVmm: number | null = null;
const { step, failed } = steps();

const cluster = (): TestCluster => {
  if (!c) throw new Error("no cluster");
  return c;
};
const cl = (): TestCluster => {
  if (!c) throw new Error("no cluster");
  return c;
};
const gw = (name = "g1"): Endpoint => cl().gateway(name);
const as = (ep: Endpoint, token: string): Endpoint => ({ ...ep, token });

interface SandboxView {
  id: string;
  node?: string;
  state: string;
  exit_reason?: string | null;
}
interface ForkReply {
  sandboxes: SandboxView[];
  errors?: unknown[];
}

const fork = (ep: Endpoint, tag: string, n: number) =>
  apiRequest<ForkReply>(ep, "POST", "/v1/sandboxes", { snapshot_tag: tag, n }, 900_000);

async function sh(ep: Endpoint, id: string, cmd: string): Promise<string> {
  const r = await apiRequest<{ exit_code: number; stdout: string; stderr: string }>(
    ep,
    "POST",
    `/v1/sandboxes/${id}/exec`,
    { cmd },
    120_000,
  );
  assert.equal(r.exit_code, 0, `${cmd}: ${r.stderr}`);
  return r.stdout;
}

async function until<T>(
  what: string,
  ms: number,
  f: () => Promise<T | null | undefined | false>,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await f().catch(() => null);
    if (v !== null && v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Node `id`'s peer pull counters (GET /metrics, parsed by Prometheus' own parser). */
async function pulls(id: string): Promise<{ bytes: number; ok: number; failed: number; registry: number }> {
  const res = await rawRequest(cl().node(id), "GET", "/metrics", undefined, 30_000);
  const m = await parseMetrics((await readAll(res)).toString("utf8"));
  return {
    bytes: value(m, "forkd_peer_pulled_bytes_total"),
    ok: value(m, "forkd_peer_pulls_total", { result: "ok" }),
    failed: value(m, "forkd_peer_pulls_total", { result: "failed" }),
    registry: value(m, "forkd_registry_fallback_pulls_total", { result: "ok" }),
  };
}

const physical = async (ep: Endpoint, tag: string) =>
  (
    await apiRequest<{ physical_bytes: number }>(
      ep,
      "GET",
      `/v1/snapshots/${encodeURIComponent(tag)}/info`,
      undefined,
      30_000,
    )
  ).physical_bytes;

/** Ends sandboxes one after another (a caller's heavy calls in flight are bounded: 429 past it). */
async function destroy(ep: Endpoint, ids: string[]): Promise<void> {
  for (const id of ids) await apiRequest(ep, "DELETE", `/v1/sandboxes/${id}`, undefined, 120_000);
}

const view = (ep: Endpoint, id: string) =>
  apiRequest<SandboxView>(ep, "GET", `/v1/sandboxes/${id}`, undefined, 30_000);

const statusOf = async (p: Promise<unknown>): Promise<number> => {
  try {
    await p;
    return 200;
  } catch (e) {
    if (e instanceof ApiError) return e.status;
    throw e;
  }
};

const newToken = async (tenant: string, o: { e2b?: boolean; admin?: boolean; max?: number } = {}) =>
  apiRequest<{ token: string; info: { id: string } }>(
    gw(),
    "POST",
    "/v1/tokens",
    {
      tenant,
      ...(o.admin ? { scope: "admin" } : {}),
      ...(o.e2b ? { e2b: true } : {}),
      ...(o.max !== undefined ? { max_sandboxes: o.max } : {}),
    },
    30_000,
  );

before(async () => {
  if (!ROOT) return;
  const t0 = Date.now();
  c = await startCluster({ nodes: 3, gateways: 2, etcdMembers: 3, settings: { FORKD_POOL_SIZE: "0" } });
  process.stderr.write(`cluster ${c.st.id} up in ${Date.now() - t0} ms\n`);
  // The snapshot is made on n1, the one node with guest images.
  await apiRequest(c.node("n1"), "POST", "/v1/snapshots", { tag: BASE, memory_mib: 256 }, 900_000);
});

after(async () => {
  // The last step took it down; a failure before leaves it up to look at.
  if (c && !failed()) await c.down();
  else if (c) process.stderr.write(`cluster left up for a look: forkd cluster down --dir ${c.st.dir}\n`);
});

step(
  "each node serves its API on its own address, from a namespace, data dir and cache of its own",
  async () => {
    if (!ROOT) return;
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

step(
  "fan-out of 30 through a gateway: all answer, over the three nodes, each pulled the snapshot once",
  async () => {
    if (!ROOT) return;
    const before = await Promise.all(NODES.map(pulls));
    const r = await fork(gw(), BASE, 30);
    assert.equal(r.sandboxes.length, 30, JSON.stringify(r.errors ?? []));
    assert.ok(r.sandboxes.every((s) => s.state === "running"));
    const per = new Map<string, number>();
    for (const s of r.sandboxes) per.set(s.node ?? "?", (per.get(s.node ?? "?") ?? 0) + 1);
    process.stderr.write(`fan-out of 30: ${JSON.stringify(Object.fromEntries(per))}\n`);
    assert.deepEqual([...per.keys()].sort(), [...NODES]);
    // One child per node answers through the gateway.
    for (const id of NODES) {
      const s = r.sandboxes.find((x) => x.node === id);
      assert.ok(s);
      assert.equal(await sh(gw("g2"), s.id, "echo $((6*7))"), "42\n");
    }
    const after = await Promise.all(NODES.map(pulls));
    const base = await physical(cl().node("n1"), BASE);
    assert.equal(after[0]!.ok - before[0]!.ok, 0, "n1 holds it: no pull");
    for (const i of [1, 2]) {
      assert.equal(after[i]!.ok - before[i]!.ok, 1, `${NODES[i]} pulled once`);
      const got = after[i]!.bytes - before[i]!.bytes;
      // Its snapshot files and the guest image, each once (the image is larger than the snapshot).
      assert.ok(got >= base, `${NODES[i]} pulled ${got} bytes; the snapshot's files are ${base}`);
    }
    assert.ok(
      Math.abs(after[1]!.bytes - before[1]!.bytes - (after[2]!.bytes - before[2]!.bytes)) < 1 << 20,
      "n2 and n3 pulled the same files",
    );
    await destroy(
      gw(),
      r.sandboxes.map((s) => s.id),
    );
  },
);

step(
  "branch on one node, fork it on the others: memory, disk and processes carried; each pulls ≈ the diff",
  async () => {
    if (!ROOT) return;
    const [src] = (await fork(cl().node("n1"), BASE, 1)).sandboxes;
    assert.ok(src);
    await sh(gw(), src.id, "echo on-disk > /root/branch.txt; (sleep 100000 & echo $! > /tmp/sleeper)");
    await apiRequest(gw(), "POST", `/v1/sandboxes/${src.id}/eval`, { code: "carried = 41" }, 120_000);
    const b = await apiRequest<{ tag: string; status: string }>(
      gw(),
      "POST",
      `/v1/sandboxes/${src.id}/branch`,
      { tag: "cl-branch" },
      600_000,
    );
    assert.equal(b.status, "ready");
    const diff = await physical(gw(), "cl-branch");
    const baseSize = await physical(gw(), BASE);
    const before = await Promise.all(NODES.map(pulls));
    const kids = [
      ...(await fork(cl().node("n2"), "cl-branch", 2)).sandboxes,
      ...(await fork(cl().node("n3"), "cl-branch", 1)).sandboxes,
    ];
    assert.equal(kids.length, 3);
    const after = await Promise.all(NODES.map(pulls));
    for (const i of [1, 2]) {
      const got = after[i]!.bytes - before[i]!.bytes;
      process.stderr.write(`${NODES[i]} pulled ${got} bytes for a branch of ${diff} (base ${baseSize})\n`);
      assert.equal(after[i]!.ok - before[i]!.ok, 1);
      assert.ok(got > 0 && got <= diff * 1.25 + (2 << 20), `${NODES[i]} pulled ${got}; the diff is ${diff}`);
      assert.ok(got < baseSize / 2, "the parent was not shipped again");
    }
    for (const k of kids) {
      const out = await sh(gw(), k.id, "cat /root/branch.txt; kill -0 $(cat /tmp/sleeper) && echo alive");
      assert.equal(out, "on-disk\nalive\n");
      const e = await apiRequest<{ ok: boolean; value: string | null }>(
        gw("g2"),
        "POST",
        `/v1/sandboxes/${k.id}/eval`,
        { code: "carried + 1" },
        120_000,
      );
      assert.deepEqual([e.ok, e.value], [true, "42"]);
    }
    await destroy(
      gw(),
      [src, ...kids].map((s) => s.id),
    );
  },
);

let tenantA = "";
let tenantB = "";
let tenantBId = "";
const aSandboxes: string[] = [];

step(
  "forkd's TypeScript SDK through a gateway: create, commands, files, PTY, fork, pause/resume, branch",
  async () => {
    if (!ROOT) return;
    tenantA = (await newToken("cl-a")).token;
    const b = await newToken("cl-b");
    tenantB = b.token;
    tenantBId = b.info.id;
    process.env.FORKD_URL = gw("g2").url;
    process.env.FORKD_TOKEN = tenantA;
    delete process.env.FORKD_SOCKET;
    const sb = await Sandbox.create(BASE);
    aSandboxes.push(sb.sandboxId);
    assert.equal((await sb.commands.run("echo $((6*7))")).stdout, "42\n");
    await sb.files.write("/root/sdk.txt", "through the gateway\n");
    assert.equal(await sb.files.read("/root/sdk.txt"), "through the gateway\n");
    let out = "";
    const dec = new TextDecoder();
    const t = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => void (out += dec.decode(d)) });
    await sb.pty.sendInput(t.pid, "stty size; echo pty-$((6*7))\n");
    await until("the pty's echo", 60_000, async () => out.includes("pty-42"));
    assert.match(out, /24 80/);
    assert.equal(await sb.pty.kill(t.pid), true);
    const br = await sb.branch({ tag: "cl-sdk" });
    const kids = await sdkFork(br.tag, 2);
    assert.equal(kids.length, 2);
    for (const k of kids) {
      aSandboxes.push(k.sandboxId);
      assert.equal(await k.files.read("/root/sdk.txt"), "through the gateway\n");
    }
    assert.equal(await sb.pause(), true);
    const back = await Sandbox.connect(sb.sandboxId);
    assert.equal((await back.commands.run("cat /root/sdk.txt")).stdout, "through the gateway\n");
    const listed = (await Sandbox.list()).map((s) => s.sandboxId).sort();
    assert.deepEqual(listed, [...aSandboxes].sort());
  },
);

step(
  "E2B's SDK through a gateway: create, commands, files, PTY, fork, pause/connect, snapshots",
  async () => {
    if (!ROOT) return;
    const key = (await newToken("cl-a", { e2b: true })).token;
    const opts = { apiKey: key, apiUrl: cl().info.gateways[0]!.e2bUrl, requestTimeoutMs: 300_000 };
    process.env.E2B_API_URL = cl().info.gateways[0]!.e2bUrl;
    process.env.E2B_SANDBOX_URL = cl().info.gateways[0]!.e2bUrl;
    process.env.E2B_API_KEY = key;
    const sbx = await E2bSandbox.create(BASE, { ...opts, timeoutMs: 600_000 });
    aSandboxes.push(sbx.sandboxId);
    assert.equal((await sbx.commands.run("echo $((6*7))")).stdout, "42\n");
    await sbx.files.write("/root/e2b.txt", "e2b through the gateway");
    assert.equal(await sbx.files.read("/root/e2b.txt"), "e2b through the gateway");
    let out = "";
    const dec = new TextDecoder();
    const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => void (out += dec.decode(d)) });
    await sbx.pty.sendInput(t.pid, new TextEncoder().encode("echo e2b-pty-$((6*7))\n"));
    await until("the pty's echo", 60_000, async () => out.includes("e2b-pty-42"));
    assert.equal(await sbx.pty.kill(t.pid), true);
    const forks = await sbx.fork({ count: 2, timeoutMs: 600_000 });
    for (const f of forks) {
      assert.ok(f instanceof E2bSandbox, f instanceof Error ? f.message : "not a sandbox");
      aSandboxes.push(f.sandboxId);
      assert.equal(await f.files.read("/root/e2b.txt"), "e2b through the gateway");
    }
    assert.equal(await sbx.pause(), true);
    const again = await E2bSandbox.connect(sbx.sandboxId, { ...opts, timeoutMs: 600_000 });
    assert.equal((await again.commands.run("cat /root/e2b.txt")).stdout, "e2b through the gateway");
    const snap = await again.createSnapshot();
    const fromSnap = await E2bSandbox.create(snap.snapshotId, { ...opts, timeoutMs: 600_000 });
    aSandboxes.push(fromSnap.sandboxId);
    assert.equal(await fromSnap.files.read("/root/e2b.txt"), "e2b through the gateway");
    const listed = await E2bSandbox.list(opts).nextItems();
    for (const id of [sbx.sandboxId, fromSnap.sandboxId])
      assert.ok(
        listed.some((s) => s.sandboxId === id),
        id,
      );
  },
);

step(
  "a tenant sees nothing of another's on any door; a revoked token is refused everywhere; a tenant's limit holds cluster-wide, at nodes too",
  async () => {
    if (!ROOT) return;
    const doors = [gw("g1"), gw("g2"), ...NODES.map((id) => cl().node(id))];
    const where = new Map<string, string | undefined>();
    for (const id of aSandboxes) where.set(id, (await view(as(gw(), tenantA), id)).node);
    for (const [i, door] of doors.entries()) {
      const mine = await apiRequest<{ sandboxes: SandboxView[] }>(as(door, tenantB), "GET", "/v1/sandboxes");
      assert.deepEqual(
        mine.sandboxes.filter((s) => aSandboxes.includes(s.id)),
        [],
        door.url,
      );
      for (const id of aSandboxes.slice(0, 2)) {
        assert.equal(await statusOf(view(as(door, tenantB), id)), 404, `${door.url} ${id}`);
        assert.equal(await statusOf(sh(as(door, tenantB), id, "true")), 404);
      }
      // A sees its own through a gateway, and through a node where it runs there.
      for (const id of aSandboxes)
        if (i < 2 || where.get(id) === NODES[i - 2]) assert.equal((await view(as(door, tenantA), id)).id, id);
    }
    await apiRequest(gw("g2"), "DELETE", `/v1/tokens/${tenantBId}`, undefined, 30_000);
    for (const door of doors)
      await until(`${door.url} refuses the revoked token`, 10_000, async () => {
        return (await statusOf(apiRequest(as(door, tenantB), "GET", "/v1/sandboxes"))) === 401;
      });
    await destroy(gw(), aSandboxes);
    // A tenant's limit holds across nodes and gateways: 3 through one, then 1 more through the other.
    const q = (await newToken("cl-q", { max: 3 })).token;
    const three = await fork(as(gw("g1"), q), BASE, 3);
    assert.equal(three.sandboxes.length, 3);
    const refused = await fork(as(gw("g2"), q), BASE, 1).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(refused instanceof ApiError && refused.code === "resource_exhausted", String(refused));
    // Straight at a node (no gateway reserved it): the node reserves across the cluster itself.
    const few = NODES.find((id) => three.sandboxes.filter((x) => x.node === id).length < 3) ?? "n1";
    const direct = await fork(as(cl().node(few), q), BASE, 1).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(direct instanceof ApiError && direct.code === "resource_exhausted", String(direct));
    assert.match(direct.message, /in the cluster/);
    await destroy(
      as(gw("g2"), q),
      three.sandboxes.map((x) => x.id),
    );
    const again = [
      ...(await fork(as(gw("g2"), q), BASE, 1)).sandboxes,
      ...(await fork(as(cl().node("n3"), q), BASE, 2)).sandboxes,
    ];
    assert.equal(again.length, 3, "room again once ended, through a gateway and at a node");
    await destroy(
      as(gw(), q),
      again.map((x) => x.id),
    );
  },
);

step(
  "a node killed -9: its sandboxes lost within the bound, new work elsewhere, its pushed branch fetched from the registry; restarted, re-adopted once",
  async () => {
    if (!ROOT) return;
    const [victim] = (await fork(cl().node("n3"), BASE, 1)).sandboxes;
    assert.ok(victim);
    await sh(gw(), victim.id, "echo survivor > /root/s.txt");
    // Its branch, pushed (through a gateway, by n3 that holds it) to a registry inside n1's
    // namespace: once n3 is gone no peer holds it, and the node a fork lands on pulls it from there.
    const reg = await startRegistry(await mkdtemp(join(tmpdir(), "forkd-it-cluster-reg-")), cl().netns("n1"));
    const elsewhere: SandboxView[] = [];
    try {
      await apiRequest(gw(), "POST", `/v1/sandboxes/${victim.id}/branch`, { tag: "cl-reg" }, 600_000);
      const pushed = await apiRequest<{ digest: string }>(
        gw(),
        "POST",
        "/v1/snapshots/cl-reg/push",
        { ref: `${reg.host}/forkd/cl-reg:1`, insecure: true },
        600_000,
      );
      assert.match(pushed.digest, /^sha256:[0-9a-f]{64}$/);
      const t0 = Date.now();
      await cl().killNode("n3");
      for (const g of ["g1", "g2"])
        await until(`${g} reports n3's sandbox lost`, LOST_WITHIN_MS, async () => {
          const v = await view(gw(g), victim.id);
          return v.state === "lost" ? v : null;
        });
      const took = Date.now() - t0;
      process.stderr.write(`n3 killed: its sandbox lost on both gateways after ${took} ms\n`);
      const v = await view(gw(), victim.id);
      assert.match(v.exit_reason ?? "", /node n3/);
      assert.equal(await statusOf(sh(gw(), victim.id, "true")), 503);
      elsewhere.push(...(await fork(gw(), BASE, 4)).sandboxes);
      assert.equal(elsewhere.length, 4);
      assert.ok(elsewhere.every((s) => s.node !== "n3"));

      // The branch only n3 held: fetched from the registry by the node the fork lands on.
      const before = { n1: await pulls("n1"), n2: await pulls("n2") };
      const t1 = Date.now();
      const [child] = (await fork(gw(), "cl-reg", 1)).sandboxes;
      assert.ok(child && (child.node === "n1" || child.node === "n2"), JSON.stringify(child));
      elsewhere.push(child);
      const at = child.node;
      const after = await pulls(at);
      process.stderr.write(
        `a fork of cl-reg (its one holder dead) answered from ${at} in ${Date.now() - t1} ms, pulled from the registry\n`,
      );
      assert.equal(after.registry - before[at].registry, 1, "one registry pull");
      assert.equal(after.ok - before[at].ok, 0, "no peer gave it");
      assert.equal(await sh(gw(), child.id, "cat /root/s.txt"), "survivor\n", "the branch's disk");
    } finally {
      await reg.stop();
    }
    await cl().restartNode("n3");
    const back = await until("n3's sandbox running again", 60_000, async () => {
      const x = await view(gw(), victim.id);
      return x.state === "running" ? x : null;
    });
    assert.equal(back.node, "n3");
    assert.equal(await sh(gw(), victim.id, "cat /root/s.txt"), "survivor\n");
    const all = (await apiRequest<{ sandboxes: SandboxView[] }>(gw("g2"), "GET", "/v1/sandboxes")).sandboxes;
    assert.equal(new Set(all.map((s) => s.id)).size, all.length, "no duplicates");
    assert.equal(all.filter((s) => s.id === victim.id).length, 1);
    await destroy(
      gw(),
      [victim, ...elsewhere].map((s) => s.id),
    );
  },
);

step(
  "a node cut off the network refuses work it cannot record; new work goes elsewhere; healed, it rejoins",
  async () => {
    if (!ROOT) return;
    const [held] = (await fork(cl().node("n2"), BASE, 1)).sandboxes;
    assert.ok(held);
    await cl().cut("n2");
    try {
      // From n2's own host (its namespace): a fork is refused once its lease is gone.
      const n2 = cl().node("n2");
      const probe = `fetch(${JSON.stringify(`${n2.url}/v1/sandboxes`)}, {method: "POST", headers: {authorization: "Bearer ${n2.token ?? ""}", "content-type": "application/json"}, body: JSON.stringify({snapshot_tag: ${JSON.stringify(BASE)}, n: 1}), signal: AbortSignal.timeout(60000)}).then(async (r) => console.log(r.status, (await r.text()).slice(0, 300)), (e) => console.log(0, String(e)))`;
      const refused = await until("n2 refuses a fork while cut off", 30_000, async () => {
        const { stdout } = await cl().inNode("n2", process.execPath, ["-e", probe]);
        return stdout.startsWith("503") ? stdout : null;
      });
      assert.match(refused, /cluster|etcd|lease|record/i);
      const v = await until("the gateways see n2's sandbox lost", LOST_WITHIN_MS, async () => {
        const x = await view(gw(), held.id);
        return x.state === "lost" ? x : null;
      });
      assert.match(v.exit_reason ?? "", /node n2/);
      const r = await fork(gw("g2"), BASE, 3);
      assert.equal(r.sandboxes.length, 3);
      assert.ok(r.sandboxes.every((s) => s.node !== "n2"));
      for (const s of r.sandboxes)
        await apiRequest(gw(), "DELETE", `/v1/sandboxes/${s.id}`, undefined, 120_000);
    } finally {
      await cl().heal("n2");
    }
    await until("n2 back in the cluster", 30_000, async () => {
      const n = await apiRequest<{ nodes: { id: string; state?: string }[] }>(gw(), "GET", "/v1/nodes");
      return n.nodes.some((x) => x.id === "n2");
    });
    const back = await until("n2's sandbox running again", 30_000, async () => {
      const x = await view(gw(), held.id);
      return x.state === "running" ? x : null;
    });
    assert.equal(back.node, "n2");
    assert.equal(await sh(gw(), held.id, "echo $((6*7))"), "42\n");
    await apiRequest(gw(), "DELETE", `/v1/sandboxes/${held.id}`, undefined, 120_000);
  },
);

step("the etcd leader killed: requests answer after the election and nothing is lost", async () => {
  if (!ROOT) return;
  const kept = (await fork(gw(), BASE, 2)).sandboxes;
  const leader = await until("an etcd leader", 15_000, () => cl().etcdLeader());
  await cl().killEtcd(leader);
  try {
    const t0 = Date.now();
    const [more, token] = await Promise.all([fork(gw("g2"), BASE, 2), newToken("cl-c")]);
    process.stderr.write(
      `etcd leader ${leader} killed: a fork and a token answered in ${Date.now() - t0} ms\n`,
    );
    assert.equal(more.sandboxes.length, 2);
    assert.ok(token.token.length > 0);
    assert.ok(
      (await apiRequest<{ sandboxes: unknown[] }>(as(gw(), token.token), "GET", "/v1/sandboxes")).sandboxes,
    );
    const all = (await apiRequest<{ sandboxes: SandboxView[] }>(gw(), "GET", "/v1/sandboxes")).sandboxes;
    for (const s of [...kept, ...more.sandboxes])
      assert.equal(all.find((x) => x.id === s.id)?.state, "running", s.id);
    await destroy(
      gw(),
      [...kept, ...more.sandboxes].map((s) => s.id),
    );
  } finally {
    await cl().restartEtcd(leader);
  }
});

step("a gateway killed: the other serves the same sandboxes at once", async () => {
  if (!ROOT) return;
  const r = await fork(gw("g1"), BASE, 3);
  await cl().killGateway("g1");
  try {
    for (const s of r.sandboxes) {
      assert.equal((await view(gw("g2"), s.id)).node, s.node);
      assert.equal(await sh(gw("g2"), s.id, "echo $((6*7))"), "42\n");
    }
  } finally {
    await cl().restartGateway("g1");
  }
  for (const s of r.sandboxes)
    await apiRequest(gw("g2"), "DELETE", `/v1/sandboxes/${s.id}`, undefined, 120_000);
});

step("the peer serving a pull killed mid-transfer: the pull resumes from another holder", async () => {
  if (!ROOT) return;
  // A branch with tens of MiB of its own, made on n1 and pulled by n2: two holders, n1 (its
  // origin) first; n3 pulls it from n1 slowed down, and n1 dies mid-transfer.
  const [src] = (await fork(cl().node("n1"), BASE, 1)).sandboxes;
  assert.ok(src);
  await sh(gw(), src.id, "head -c 48M /dev/urandom > /root/big.bin; sha256sum /root/big.bin > /root/big.sum");
  await apiRequest(gw(), "POST", `/v1/sandboxes/${src.id}/branch`, { tag: "cl-big" }, 600_000);
  await apiRequest(gw(), "DELETE", `/v1/sandboxes/${src.id}`, undefined, 120_000);
  const [onN2] = (await fork(cl().node("n2"), "cl-big", 1)).sandboxes;
  assert.ok(onN2);
  const size = await physical(cl().node("n1"), "cl-big");
  const before = await pulls("n3");
  await cl().throttle("n1", 40);
  let pulled: Promise<ForkReply> | null = null;
  try {
    pulled = fork(cl().node("n3"), "cl-big", 1);
    pulled.catch(() => undefined);
    await until(
      "n3 receiving from n1",
      60_000,
      async () => (await pulls("n3")).bytes - before.bytes > 4 << 20,
    );
    await cl().killNode("n1");
  } finally {
    await cl().unthrottle("n1");
  }
  const r = await pulled;
  const after = await pulls("n3");
  const got = after.bytes - before.bytes;
  process.stderr.write(`n3 pulled ${got} bytes of a ${size}-byte branch, its first holder killed midway\n`);
  assert.equal(r.sandboxes.length, 1);
  assert.equal(after.ok - before.ok, 1);
  assert.ok(got < size * 1.3 + (4 << 20), `resumed, not started again: ${got} of ${size}`);
  assert.equal(
    await sh(gw(), r.sandboxes[0]!.id, "sha256sum -c /root/big.sum >/dev/null && echo ok"),
    "ok\n",
  );
  await cl().restartNode("n1");
  await destroy(gw(), [onN2.id]);
  // Left running: `down` must remove it (the last step).
  leftVmm = (await apiRequest<{ pid: number }>(gw(), "GET", `/v1/sandboxes/${r.sandboxes[0]!.id}`)).pid;
});

step(
  "a `forkd cluster up` killed midway leaves a record from which down removes all it made (beside another cluster)",
  async () => {
    if (!ROOT) return;
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

step("down removes every process, namespace, link, table, marker and file the cluster made", async () => {
  if (!ROOT) return;
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
});
