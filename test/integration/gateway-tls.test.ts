/**
 * Gateways relaying to https nodes, against a real etcd member (no VMs: the nodes are fake,
 * test/helpers/fake-node.ts, serving https with a self-signed certificate for 127.0.0.1). Node
 * `good`'s certificate is the gateway's FORKD_NODE_CA_FILE, node `bad`'s is trusted by no one.
 * Through a gateway in this process and the real `forkd gateway` process: a fork, a forwarded
 * call, an NDJSON output stream, the event stream, a terminal WebSocket and E2B's door reach
 * `good` over TLS; `bad` is refused at once with a 502 naming its certificate (a fork goes
 * elsewhere, a call or an upgrade to one of its sandboxes is refused, nothing hangs); a
 * FORKD_NODE_CA_FILE that holds no certificate stops the process with its reason.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ReadableStreamReadResult } from "node:stream/web";
import { after, before, test } from "node:test";
import WebSocket from "ws";
import type { Caller } from "../../src/access/caller.js";
import { ClusterKeys } from "../../src/cluster/keys.js";
import type { SandboxLocation } from "../../src/cluster/records.js";
import { EtcdKv } from "../../src/etcd/etcd-kv.js";
import { parseEndpoints } from "../../src/etcd/endpoints.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { newSandboxId } from "../../src/util/ids.js";
import { nodeTrust } from "../../src/util/node-trust.js";
import { startEtcd } from "../helpers/etcd.js";
import type { EtcdMember } from "../helpers/etcd.js";
import { FakeNode, catalogEntry } from "../helpers/fake-node.js";
import { until } from "../helpers/fake-cluster.js";
import { ADMIN, TOKENS, call, startTestGateway } from "../helpers/gateway.js";
import type { TestGateway } from "../helpers/gateway.js";
import { freePort } from "../helpers/port.js";
import { selfSignedCert } from "../helpers/tls.js";
import type { TestCert } from "../helpers/tls.js";

const ADMIN_TOKEN = randomBytes(24).toString("base64url");
const tokens: ReadonlyMap<string, Caller> = new Map([...TOKENS, [ADMIN_TOKEN, ADMIN]]);
const keys = new ClusterKeys("/gw-tls/");

let etcd: EtcdMember;
let dir: string;
let certGood: TestCert;
const kvs: EtcdKv[] = [];
const nodes: FakeNode[] = [];
let gw: TestGateway;
let proc: ChildProcess | null = null;
let procUrl: string;
/** A sandbox of node `bad` (its record written as the node would). */
let onBad: string;

interface ForkReply {
  sandboxes: { id: string; node: string }[];
}

const etcdUrl = () => etcd.url.replace("http://", "etcd://");

const newKv = (): EtcdKv => {
  const kv = new EtcdKv(parseEndpoints(etcdUrl()));
  kvs.push(kv);
  return kv;
};

/** `forkd gateway` with `env` added; its stderr so far, and its exit code once it exited. */
function startProcess(env: Record<string, string>): { p: ChildProcess; log: () => string } {
  const p = spawn(process.execPath, [join(REPO_DIR, "dist", "src", "cli", "main.js"), "gateway"], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...env },
    stdio: ["ignore", "ignore", "pipe"],
  });
  let log = "";
  p.stderr?.on("data", (d: Buffer) => (log += d.toString()));
  return { p, log: () => log };
}

before(async () => {
  etcd = await startEtcd();
  dir = await mkdtemp(join(tmpdir(), "forkd-gw-tls-"));
  await mkdir(join(dir, "good"));
  await mkdir(join(dir, "bad"));
  certGood = await selfSignedCert(join(dir, "good"));
  const certBad = await selfSignedCert(join(dir, "bad"));
  for (const [id, cert] of [
    ["good", certGood],
    ["bad", certBad],
  ] as const) {
    const kv = newKv();
    nodes.push(
      await FakeNode.start({
        id,
        kv,
        keys,
        tokens,
        holds: id === "good" ? { app: 1 } : {},
        tls: { cert: cert.pem, key: await readFile(cert.key) },
        onKill: async () => kv.close(),
      }),
    );
  }
  const kv = newKv();
  await kv.put(keys.catalogEntry("app"), JSON.stringify(catalogEntry("app", "good")));
  onBad = newSandboxId();
  const now = new Date().toISOString();
  const loc: SandboxLocation = {
    id: onBad,
    node: "bad",
    owner: "bob",
    tag: "app",
    state: "running",
    reason: null,
    created: now,
    updated: now,
  };
  await kv.txn(
    [],
    [
      { type: "put", key: keys.sandbox(onBad), value: JSON.stringify(loc) },
      { type: "put", key: keys.byNodeEntry("bad", onBad), value: "" },
      { type: "put", key: keys.byOwnerEntry("bob", onBad), value: "" },
    ],
  );
  gw = await startTestGateway({
    kv,
    keys,
    tokens,
    nodeTrust: nodeTrust("FORKD_NODE_CA_FILE", certGood.cert, certGood.pem.toString("utf8")),
    // Long bounds on a connection and an upgrade: a refusal within them is the handshake's.
    bounds: { connectMs: 20_000, upgradeMs: 20_000 },
  });
});

after(async () => {
  proc?.kill("SIGTERM");
  await gw?.close();
  for (const n of nodes) await n.stop().catch(() => undefined);
  for (const kv of kvs) await kv.close().catch(() => undefined);
  await etcd?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

test("nodes' addresses are https: the gateway forks on the trusted node and forwards a call to it over TLS", async () => {
  const [good] = nodes;
  assert.match(good!.api, /^https:\/\/127\.0\.0\.1:\d+$/);
  const r = await call<ForkReply>(gw.url, "POST", "/v1/sandboxes", {
    token: "bob-token",
    body: { snapshot_tag: "app", n: 4 },
  });
  assert.equal(r.status, 201, JSON.stringify(r.body));
  // None on `bad`: the part sent there never reached it (its certificate is refused) and was placed again.
  assert.deepEqual(
    r.body.sandboxes.map((s) => s.node),
    ["good", "good", "good", "good"],
  );
  const sb = r.body.sandboxes[0]!;
  const v = await call<{ node: string; authorization: string; path: string }>(
    gw.url,
    "GET",
    `/v1/sandboxes/${sb.id}/files/stat?path=/`,
    { token: "bob-token" },
  );
  assert.equal(v.status, 200, JSON.stringify(v.body));
  assert.deepEqual([v.body.node, v.body.authorization], ["good", "Bearer bob-token"]);
  assert.equal(nodes[1]!.seen.length, 0, "node bad received nothing");
  const m = await fetch(`${gw.url}/metrics`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  // Placement sent a part there (both nodes have room): refused by the handshake, counted.
  assert.match(await m.text(), /forkd_gateway_node_failures_total\{node="bad",reason="unreachable"\} [1-9]/);
});

test("an output stream, the event stream and a terminal WebSocket come from an https node", async () => {
  const r = await call<ForkReply>(gw.url, "POST", "/v1/sandboxes", {
    token: "bob-token",
    body: { snapshot_tag: "app" },
  });
  const sb = r.body.sandboxes[0]!;
  // NDJSON output, relayed as it comes.
  const out = await fetch(`${gw.url}/v1/sandboxes/${sb.id}/exec/stream`, {
    method: "POST",
    headers: { authorization: "Bearer bob-token" },
    body: JSON.stringify({ lines: 3 }),
  });
  assert.equal(out.status, 200);
  const lines = (await out.text()).trim().split("\n");
  assert.deepEqual(
    lines.slice(0, 3).map((l) => (JSON.parse(l) as { data: string }).data),
    ["line 0 from good", "line 1 from good", "line 2 from good"],
  );
  // The event stream: the gateway reads the node's own over TLS (`bad`'s cannot start).
  const ac = new AbortController();
  const ev = await fetch(`${gw.url}/v1/events`, {
    headers: { authorization: "Bearer bob-token" },
    signal: ac.signal,
  });
  assert.equal(ev.headers.get("content-type"), "text/event-stream");
  const reader: ReadableStreamDefaultReader<Uint8Array> = ev.body!.getReader();
  let buf = "";
  const next = async (event: string): Promise<Record<string, unknown>> => {
    for (;;) {
      const m = new RegExp(`event: ${event}\\ndata: (.*)\\n\\n`).exec(buf);
      if (m) {
        buf = buf.slice((m.index ?? 0) + m[0].length);
        return JSON.parse(m[1] ?? "{}") as Record<string, unknown>;
      }
      const chunk: ReadableStreamReadResult<Uint8Array> = await reader.read();
      if (chunk.done) throw new Error("the stream ended");
      buf += Buffer.from(chunk.value).toString("utf8");
    }
  };
  await next("state");
  const made = await call<ForkReply>(gw.url, "POST", "/v1/sandboxes", {
    token: "bob-token",
    body: { snapshot_tag: "app" },
  });
  const told = await next("sandbox");
  assert.equal(told.id, made.body.sandboxes[0]!.id);
  ac.abort();
  // A terminal: the upgrade relayed over TLS, echoed by the node.
  const ws = new WebSocket(`${gw.url.replace("http", "ws")}/v1/sandboxes/${sb.id}/terminal`, {
    headers: { authorization: "Bearer bob-token" },
  });
  const got = await new Promise<string>((resolve, reject) => {
    ws.on("open", () => ws.send("hello"));
    ws.on("message", (m: Buffer) => resolve(m.toString()));
    ws.on("error", reject);
  });
  ws.close();
  assert.equal(got, "good:hello");
});

test("E2B's door reaches an https node: a create, a listing and the sandbox plane", async () => {
  const made = await call<{ sandboxID: string; clientID: string }>(gw.e2bUrl, "POST", "/sandboxes", {
    headers: { "x-api-key": "bob-token" },
    body: { templateID: "app" },
  });
  assert.equal(made.status, 201, JSON.stringify(made.body));
  assert.equal(made.body.clientID, "good");
  const list = await call<{ sandboxID: string }[]>(gw.e2bUrl, "GET", "/v2/sandboxes", {
    headers: { "x-api-key": "bob-token" },
  });
  assert.equal(list.status, 200);
  assert.ok(list.body.some((s) => s.sandboxID === made.body.sandboxID));
  const plane = await call<{ node: string; accessToken: string }>(
    gw.e2bUrl,
    "POST",
    "/process.Process/List",
    {
      headers: {
        "e2b-sandbox-id": made.body.sandboxID,
        "e2b-sandbox-port": "49983",
        "x-access-token": "envd-secret",
      },
      body: {},
    },
  );
  assert.equal(plane.status, 200, JSON.stringify(plane.body));
  assert.deepEqual([plane.body.node, plane.body.accessToken], ["good", "envd-secret"]);
});

test("a node whose certificate the gateway does not trust is refused at once: 502 naming it", async () => {
  const started = performance.now();
  const r = await call<{ error: { code: string; message: string } }>(
    gw.url,
    "GET",
    `/v1/sandboxes/${onBad}/files/stat?path=/`,
    { token: "bob-token" },
  );
  assert.equal(r.status, 502, JSON.stringify(r.body));
  assert.equal(r.body.error.code, "unavailable");
  assert.match(r.body.error.message, /^node bad did not answer: .*certificate/);
  const ws = new WebSocket(`${gw.url.replace("http", "ws")}/v1/sandboxes/${onBad}/terminal`, {
    headers: { authorization: "Bearer bob-token" },
  });
  const status = await new Promise<number>((resolve) => {
    ws.on("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0));
    ws.on("error", () => resolve(-1));
  });
  assert.equal(status, 502);
  // Refused by the handshake, not by a bound running out (this gateway's: 20 s).
  const took = performance.now() - started;
  assert.ok(took < 10_000, `took ${took} ms`);
  assert.equal(nodes[1]!.seen.length, 0, "node bad received nothing");
});

test("forkd gateway (the process) trusts FORKD_NODE_CA_FILE; one holding no certificate stops it", async () => {
  const secret = join(dir, "secret");
  await writeFile(secret, randomBytes(32).toString("hex"), { mode: 0o600 });
  const env = {
    FORKD_CLUSTER: etcdUrl(),
    FORKD_CLUSTER_PREFIX: keys.prefix,
    FORKD_CLUSTER_SECRET_FILE: secret,
    FORKD_TOKEN: ADMIN_TOKEN,
  };
  const notPem = join(dir, "not-a-ca.pem");
  await writeFile(notPem, "not a certificate\n");
  const refused = startProcess({ ...env, FORKD_GATEWAY_LISTEN: "127.0.0.1:0", FORKD_NODE_CA_FILE: notPem });
  const code = await new Promise<number | null>((resolve) => refused.p.once("exit", resolve));
  assert.notEqual(code, 0);
  assert.match(refused.log(), /FORKD_NODE_CA_FILE .*not-a-ca\.pem: holds no PEM certificate/);

  const port = await freePort();
  procUrl = `http://127.0.0.1:${port}`;
  const started = startProcess({
    ...env,
    FORKD_GATEWAY_LISTEN: `127.0.0.1:${port}`,
    FORKD_NODE_CA_FILE: certGood.cert,
  });
  proc = started.p;
  await until(
    async () =>
      (await fetch(`${procUrl}/v1/health`)
        .then((r) => r.ok)
        .catch(() => false)) || proc?.exitCode !== null,
    20_000,
    "forkd gateway to listen",
  );
  assert.equal(proc.exitCode, null, started.log());
  const r = await call<ForkReply>(procUrl, "POST", "/v1/sandboxes", {
    token: ADMIN_TOKEN,
    body: { snapshot_tag: "app", n: 2 },
  });
  assert.equal(r.status, 201, JSON.stringify(r.body));
  assert.ok(r.body.sandboxes.every((s) => s.node === "good"));
  const v = await call<{ node: string }>(
    procUrl,
    "GET",
    `/v1/sandboxes/${r.body.sandboxes[0]!.id}/files/stat?path=/`,
    {
      token: ADMIN_TOKEN,
    },
  );
  assert.deepEqual([v.status, v.body.node], [200, "good"]);
  const bad = await call(procUrl, "GET", `/v1/sandboxes/${onBad}/files/stat?path=/`, { token: ADMIN_TOKEN });
  assert.equal(bad.status, 502);
});
