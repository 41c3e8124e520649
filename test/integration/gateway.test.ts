/**
 * The gateway against a real etcd member (no VMs: the nodes are fake, test/helpers/fake-node.ts,
 * registering and answering as nodes do; the nodes' cluster mode is tested with real daemons
 * elsewhere). Two gateways: one in this process, one the real `forkd gateway` process (its
 * wiring: environment, etcd, listeners). A node killed (its lease left to expire, as etcd does
 * for a node killed with -9) has its sandboxes reported lost within 15 s by either gateway, and
 * new work goes elsewhere; a gateway killed, the other serves the same sandboxes at once; a node
 * dying mid-stream cuts the client's stream and the gateway serves on.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import type { Caller } from "../../src/access/caller.js";
import { ClusterKeys } from "../../src/cluster/keys.js";
import { EtcdKv } from "../../src/etcd/etcd-kv.js";
import { parseEndpoints } from "../../src/etcd/endpoints.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { startEtcd } from "../helpers/etcd.js";
import type { EtcdMember } from "../helpers/etcd.js";
import { FakeNode, catalogEntry } from "../helpers/fake-node.js";
import { until } from "../helpers/fake-cluster.js";
import { ADMIN, TOKENS, call, startTestGateway } from "../helpers/gateway.js";
import type { TestGateway } from "../helpers/gateway.js";
import { freePort } from "../helpers/port.js";

const ADMIN_TOKEN = randomBytes(24).toString("base64url");
const tokens: ReadonlyMap<string, Caller> = new Map([...TOKENS, [ADMIN_TOKEN, ADMIN]]);
const keys = new ClusterKeys("/gw-it/");

let etcd: EtcdMember;
let dir: string;
const kvs: EtcdKv[] = [];
const nodes: FakeNode[] = [];
let gwA: TestGateway;
let procB: ChildProcess;
let urlB: string;
let kvA: EtcdKv;

const newKv = (): EtcdKv => {
  const kv = new EtcdKv(parseEndpoints(etcd.url.replace("http://", "etcd://")));
  kvs.push(kv);
  return kv;
};

interface ForkReply {
  sandboxes: { id: string; node: string }[];
}

before(async () => {
  etcd = await startEtcd();
  dir = await mkdtemp(join(tmpdir(), "forkd-gw-it-"));
  for (const id of ["n1", "n2", "n3"]) {
    // Each node its own etcd client: closing it stops its lease's keepalives, as a dead node's.
    const kv = newKv();
    nodes.push(
      await FakeNode.start({
        id,
        kv,
        keys,
        tokens,
        ttl: 6,
        holds: id === "n1" ? { app: 1 } : {},
        onKill: async () => kv.close(),
      }),
    );
  }
  kvA = newKv();
  await kvA.put(keys.catalogEntry("app"), JSON.stringify(catalogEntry("app", "n1")));
  gwA = await startTestGateway({ kv: kvA, keys, tokens, sweepMs: 2_000 });
  const secret = join(dir, "secret");
  await writeFile(secret, randomBytes(32).toString("hex"), { mode: 0o600 });
  const port = await freePort();
  urlB = `http://127.0.0.1:${port}`;
  procB = spawn(process.execPath, [join(REPO_DIR, "dist", "src", "cli", "main.js"), "gateway"], {
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      FORKD_CLUSTER: etcd.url.replace("http://", "etcd://"),
      FORKD_CLUSTER_PREFIX: keys.prefix,
      FORKD_CLUSTER_SECRET_FILE: secret,
      FORKD_GATEWAY_LISTEN: `127.0.0.1:${port}`,
      FORKD_TOKEN: ADMIN_TOKEN,
      FORKD_GATEWAY_SWEEP_MS: "2000",
    },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let log = "";
  procB.stderr?.on("data", (d: Buffer) => (log += d.toString()));
  await until(
    async () =>
      (await fetch(`${urlB}/v1/health`)
        .then((r) => r.ok)
        .catch(() => false)) || procB.exitCode !== null,
    20_000,
    "forkd gateway to listen",
  );
  assert.equal(procB.exitCode, null, log);
});

after(async () => {
  procB?.kill("SIGTERM");
  await gwA?.close();
  for (const n of nodes) await n.stop().catch(() => undefined);
  for (const kv of kvs) await kv.close().catch(() => undefined);
  await etcd?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

test("forkd gateway (the process) sees the cluster and places a fork over it", async () => {
  const h = await call<{ ok: boolean; cluster: { nodes: number } }>(urlB, "GET", "/v1/health");
  assert.deepEqual([h.body.ok, h.body.cluster.nodes], [true, 3]);
  const r = await call<ForkReply>(urlB, "POST", "/v1/sandboxes", {
    token: ADMIN_TOKEN,
    body: { snapshot_tag: "app", n: 9 },
  });
  assert.equal(r.status, 201, JSON.stringify(r.body));
  assert.equal(new Set(r.body.sandboxes.map((s) => s.node)).size, 3);
  const nodesList = await call<{ nodes: { id: string }[] }>(urlB, "GET", "/v1/nodes", { token: ADMIN_TOKEN });
  assert.deepEqual(
    nodesList.body.nodes.map((n) => n.id),
    ["n1", "n2", "n3"],
  );
});

test("a gateway killed: the other serves the same sandboxes at once", async () => {
  const other = await startTestGateway({ kv: newKv(), keys, tokens });
  const r = await call<ForkReply>(other.url, "POST", "/v1/sandboxes", {
    token: "bob-token",
    body: { snapshot_tag: "app", n: 3 },
  });
  assert.equal(r.status, 201);
  other.kill();
  for (const sb of r.body.sandboxes) {
    const v = await call<{ node: string }>(gwA.url, "GET", `/v1/sandboxes/${sb.id}/files/stat?path=/`, {
      token: "bob-token",
    });
    assert.equal(v.status, 200);
    assert.equal(v.body.node, sb.node);
  }
  const list = await call<{ sandboxes: { id: string }[] }>(urlB, "GET", "/v1/sandboxes", {
    token: ADMIN_TOKEN,
  });
  for (const sb of r.body.sandboxes) assert.ok(list.body.sandboxes.some((s) => s.id === sb.id));
});

test("a node dying mid-stream cuts the client's stream; the gateway serves on", async () => {
  const r = await call<ForkReply>(gwA.url, "POST", "/v1/sandboxes", {
    token: "bob-token",
    body: { snapshot_tag: "app", n: 6 },
  });
  const onN3 = r.body.sandboxes.find((s) => s.node === "n3");
  assert.ok(onN3, JSON.stringify(r.body));
  const res = await fetch(`${gwA.url}/v1/sandboxes/${onN3.id}/exec/stream`, {
    method: "POST",
    headers: { authorization: "Bearer bob-token" },
    body: JSON.stringify({ lines: 100, die_after: 3 }),
  });
  assert.equal(res.status, 200);
  await assert.rejects(res.text());
  const h = await call(gwA.url, "GET", "/v1/health");
  assert.equal(h.status, 200);
});

test("a node killed: its sandboxes are lost within 15 s on every gateway, and new work goes elsewhere", async (t) => {
  // n3 died in the test before (its lease left to expire); n2 now.
  const r = await call<ForkReply>(gwA.url, "POST", "/v1/sandboxes", {
    token: "bob-token",
    body: { snapshot_tag: "app", n: 8 },
  });
  const onN2 = r.body.sandboxes.filter((s) => s.node === "n2");
  assert.ok(onN2.length > 0, JSON.stringify(r.body));
  const killed = Date.now();
  nodes[1]!.kill();
  for (const url of [gwA.url, urlB]) {
    const token = url === urlB ? ADMIN_TOKEN : "bob-token";
    await until(
      async () => {
        const v = await call<{ state: string }>(url, "GET", `/v1/sandboxes/${onN2[0]!.id}`, { token });
        return v.body.state === "lost";
      },
      15_000,
      `n2's sandbox to be reported lost by ${url}`,
    );
  }
  const took = Date.now() - killed;
  t.diagnostic(`n2's sandboxes reported lost by both gateways ${took} ms after its death (lease TTL 6 s)`);
  assert.ok(took < 15_000, `marked after ${took} ms`);
  const v = await call<{ state: string; exit_reason: string }>(urlB, "GET", `/v1/sandboxes/${onN2[0]!.id}`, {
    token: ADMIN_TOKEN,
  });
  assert.match(v.body.exit_reason, /^node n2 (stopped answering the cluster|was not in the cluster) at /);
  const exec = await call<{ error: { code: string } }>(gwA.url, "POST", `/v1/sandboxes/${onN2[0]!.id}/exec`, {
    token: "bob-token",
    body: { cmd: ["true"] },
  });
  assert.equal(exec.status, 503);
  const again = await call<ForkReply>(urlB, "POST", "/v1/sandboxes", {
    token: ADMIN_TOKEN,
    body: { snapshot_tag: "app", n: 4 },
  });
  assert.equal(again.status, 201);
  assert.ok(
    again.body.sandboxes.every((s) => s.node === "n1"),
    JSON.stringify(again.body),
  );
});
