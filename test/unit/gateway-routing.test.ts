/**
 * The gateway's routing (src/gateway/rest.ts, sandbox-route.ts, relay.ts) over a fake etcd and
 * fake nodes: a sandbox's calls go to its node with the caller's token, and only the caller's;
 * a node's death marks its sandboxes lost at once and the gateway answers for them from etcd; a
 * node that hangs is bounded, one that dies mid-stream cuts the client's stream (the gateway
 * lives), a client that hangs up ends the node's request; listings merge nodes and etcd.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import type { ReadableStreamReadResult } from "node:stream/web";
import WebSocket from "ws";
import { routeSandbox } from "../../src/gateway/sandbox-route.js";
import type { NodeRecord, SandboxLocation } from "../../src/cluster/records.js";
import { fakeCluster, until } from "../helpers/fake-cluster.js";
import type { FakeCluster } from "../helpers/fake-cluster.js";
import { ADMIN, call, tenant } from "../helpers/gateway.js";

interface ForkReply {
  sandboxes: { id: string; node: string }[];
}
type ErrorReply = { error: { code: string; message: string; details: Record<string, unknown> } };

async function forkOn(c: FakeCluster, token: string, n: number): Promise<{ id: string; node: string }[]> {
  const r = await call<ForkReply>(c.gw.url, "POST", "/v1/sandboxes", {
    token,
    body: { snapshot_tag: "app", n },
  });
  assert.equal(r.status, 201);
  return r.body.sandboxes;
}

const loc = (o: Partial<SandboxLocation>): SandboxLocation => ({
  id: "sb-aaaaaaaaaaaaaaaa",
  node: "n1",
  owner: "alice",
  tag: "app",
  state: "running",
  reason: null,
  created: "2025-01-01T00:00:00.000Z",
  updated: "2025-01-01T00:00:00.000Z",
  ...o,
});

test("routing decisions: no record or another tenant's is none; lost; node absent; else its node", () => {
  const node = { id: "n1" } as NodeRecord;
  const nodeOf = (id: string) => (id === "n1" ? node : undefined);
  assert.equal(routeSandbox(null, ADMIN, nodeOf).kind, "none");
  assert.equal(routeSandbox(loc({}), tenant("bob"), nodeOf).kind, "none");
  assert.equal(routeSandbox(loc({ owner: null }), tenant("alice"), nodeOf).kind, "none");
  assert.equal(routeSandbox(loc({ state: "lost" }), tenant("alice"), nodeOf).kind, "lost");
  assert.equal(routeSandbox(loc({ node: "n9" }), ADMIN, nodeOf).kind, "absent");
  const r = routeSandbox(loc({}), tenant("alice"), nodeOf);
  assert.equal(r.kind, "node");
  assert.equal(r.kind === "node" && r.node, node);
});

test("a sandbox's calls go to its node with the caller's token; another tenant's is not found and reaches nobody", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    const [sb] = await forkOn(c, "alice-token", 1);
    assert.ok(sb);
    const node = c.nodes.find((n) => n.o.id === sb.node)!;
    const r = await call<{ node: string; method: string; path: string; authorization: string; body: string }>(
      c.gw.url,
      "POST",
      `/v1/sandboxes/${sb.id}/files/mkdir?x=1`,
      { token: "alice-token", body: { path: "/tmp/a" } },
    );
    assert.equal(r.status, 200);
    assert.deepEqual(r.body, {
      node: sb.node,
      method: "POST",
      path: `/v1/sandboxes/${sb.id}/files/mkdir?x=1`,
      authorization: "Bearer alice-token",
      body: JSON.stringify({ path: "/tmp/a" }),
    });
    const seen = node.seen.length;
    const other = await call<ErrorReply>(c.gw.url, "GET", `/v1/sandboxes/${sb.id}`, { token: "bob-token" });
    assert.equal(other.status, 404);
    assert.equal(other.body.error.message, `no sandbox ${sb.id}`);
    const unknown = await call<ErrorReply>(c.gw.url, "GET", `/v1/sandboxes/sb-zzzzzzzzzzzzzzzz`, {
      token: "alice-token",
    });
    assert.equal(unknown.status, 404);
    const bad = await call(c.gw.url, "GET", `/v1/sandboxes/${sb.id}`, { token: "wrong-token" });
    assert.equal(bad.status, 401);
    assert.equal(node.seen.length, seen);
    // An admin reaches it.
    assert.equal(
      (await call(c.gw.url, "GET", `/v1/sandboxes/${sb.id}`, { token: "admin-token" })).status,
      200,
    );
  } finally {
    await c.close();
  }
});

test("a node's death marks its sandboxes lost at once; the gateway answers them from etcd", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    const sbs = await forkOn(c, "alice-token", 4);
    const dead = c.nodes[1]!;
    const mine = sbs.filter((s) => s.node === dead.o.id);
    assert.ok(mine.length > 0);
    dead.kill();
    const id = mine[0]!.id;
    await until(
      async () =>
        (await call<{ state: string }>(c.gw.url, "GET", `/v1/sandboxes/${id}`, { token: "alice-token" })).body
          .state === "lost",
    );
    const v = await call<{ state: string; exit_reason: string; node: string; tag: string }>(
      c.gw.url,
      "GET",
      `/v1/sandboxes/${id}`,
      {
        token: "alice-token",
      },
    );
    assert.equal(v.status, 200);
    assert.match(v.body.exit_reason, /^node n2 stopped answering the cluster at \d{4}-/);
    assert.equal(v.body.node, "n2");
    assert.equal(v.body.tag, "app");
    const exec = await call<ErrorReply>(c.gw.url, "POST", `/v1/sandboxes/${id}/exec`, {
      token: "alice-token",
      body: { cmd: ["true"] },
    });
    assert.equal(exec.status, 503);
    assert.equal(exec.body.error.code, "unavailable");
    assert.equal(exec.body.error.details.state, "lost");
    assert.match(exec.body.error.message, /^sandbox sb-\w+ is lost: node n2 stopped answering/);
    // Every one of its sandboxes, and only those; their quota is free again.
    const list = await call<{ sandboxes: { id: string; state: string }[] }>(
      c.gw.url,
      "GET",
      "/v1/sandboxes",
      { token: "alice-token" },
    );
    assert.equal(list.body.sandboxes.length, 4);
    for (const s of list.body.sandboxes)
      assert.equal(s.state, mine.some((m) => m.id === s.id) ? "lost" : "running");
    assert.equal(await c.kv.count(c.keys.byOwner("alice")), 4 - mine.length);
    const lostOnly = await call<{ sandboxes: unknown[] }>(c.gw.url, "GET", "/v1/sandboxes?state=lost", {
      token: "alice-token",
    });
    assert.equal(lostOnly.body.sandboxes.length, mine.length);
    // A kill of a lost sandbox forgets it.
    const del = await call(c.gw.url, "DELETE", `/v1/sandboxes/${id}`, { token: "alice-token" });
    assert.deepEqual(del.body, { deleted: id });
    assert.equal((await call(c.gw.url, "GET", `/v1/sandboxes/${id}`, { token: "alice-token" })).status, 404);
  } finally {
    await c.close();
  }
});

test("an exec stream is relayed as it comes; a node that dies mid-stream cuts it, and the gateway serves on", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    const sbs = await forkOn(c, "bob-token", 6);
    const onN1 = sbs.find((s) => s.node === "n1")!;
    const onN2 = sbs.find((s) => s.node === "n2")!;
    const whole = await fetch(`${c.gw.url}/v1/sandboxes/${onN1.id}/exec/stream`, {
      method: "POST",
      headers: { authorization: "Bearer bob-token" },
      body: JSON.stringify({ lines: 3 }),
    });
    assert.equal(whole.headers.get("content-type"), "application/x-ndjson");
    const lines = (await whole.text())
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { type: string });
    assert.deepEqual(
      lines.map((l) => l.type),
      ["stdout", "stdout", "stdout", "exit"],
    );
    const cut = await fetch(`${c.gw.url}/v1/sandboxes/${onN2.id}/exec/stream`, {
      method: "POST",
      headers: { authorization: "Bearer bob-token" },
      body: JSON.stringify({ lines: 50, die_after: 2 }),
    });
    assert.equal(cut.status, 200);
    await assert.rejects(cut.text()); // a broken transfer, never a clean end
    const after = await call(c.gw.url, "GET", `/v1/sandboxes/${onN1.id}`, { token: "bob-token" });
    assert.equal(after.status, 200);
  } finally {
    await c.close();
  }
});

test("a client that hangs up mid-stream ends the node's request", async () => {
  const c = await fakeCluster({ nodes: 1 });
  try {
    const [sb] = await forkOn(c, "bob-token", 1);
    const node = c.nodes[0]!;
    const closed = new Promise<void>((resolve) => {
      const u = new URL(c.gw.url);
      const req = request({
        host: u.hostname,
        port: u.port,
        method: "POST",
        path: `/v1/sandboxes/${sb!.id}/exec/stream`,
        headers: { authorization: "Bearer bob-token" },
      });
      req.on("response", (res) => {
        res.once("data", () => {
          req.destroy(); // the client goes after its first bytes
          resolve();
        });
      });
      req.on("error", () => undefined);
      req.end(JSON.stringify({ lines: 1000 }));
    });
    await closed;
    // The node's side was closed too: its stream timer stopped writing (its socket is gone).
    await until(() => c.gw.running.gateway.relays.count("n1") === 0, 3000, "the relay to end");
    assert.ok(node.seen.some((s) => s.path.endsWith("/exec/stream")));
  } finally {
    await c.close();
  }
});

test("a node that hangs is answered within the bound (504), naming it", async () => {
  const c = await fakeCluster({ nodes: 1, bounds: { replyMs: 300 } });
  try {
    const [sb] = await forkOn(c, "bob-token", 1);
    const t0 = Date.now();
    const r = await call<ErrorReply>(c.gw.url, "GET", `/v1/sandboxes/${sb!.id}/hang`, { token: "bob-token" });
    assert.ok(Date.now() - t0 < 2000);
    assert.equal(r.status, 502);
    assert.equal(r.body.error.code, "unavailable");
    assert.match(r.body.error.message, /^node n1 did not answer: /);
  } finally {
    await c.close();
  }
});

test("listings merge every node's page with etcd's lost records, paged by next_token", async () => {
  const c = await fakeCluster();
  try {
    await forkOn(c, "bob-token", 7);
    await forkOn(c, "alice-token", 2);
    const ids: string[] = [];
    let token: string | null = null;
    for (let page = 0; page < 10; page++) {
      const q: string = `/v1/sandboxes?limit=3${token ? `&next_token=${token}` : ""}`;
      const r = await call<{ sandboxes: { id: string; owner: string }[]; next_token: string | null }>(
        c.gw.url,
        "GET",
        q,
        {
          token: "bob-token",
        },
      );
      assert.equal(r.status, 200);
      assert.ok(r.body.sandboxes.length <= 3);
      ids.push(...r.body.sandboxes.map((s) => s.id));
      assert.ok(r.body.sandboxes.every((s) => s.owner === "bob"));
      token = r.body.next_token;
      if (!token) break;
    }
    assert.equal(ids.length, 7);
    assert.equal(new Set(ids).size, 7);
    const all = await call<{ sandboxes: unknown[] }>(c.gw.url, "GET", "/v1/sandboxes", {
      token: "admin-token",
    });
    assert.equal(all.body.sandboxes.length, 9);
    assert.equal(
      (await call(c.gw.url, "GET", "/v1/sandboxes?state=bogus", { token: "bob-token" })).status,
      400,
    );
    assert.equal(
      (await call(c.gw.url, "GET", "/v1/sandboxes?next_token=eA", { token: "bob-token" })).status,
      400,
    );
  } finally {
    await c.close();
  }
});

test("snapshots: the catalog named for the caller, nodes' pending ones; a holder serves a tag's calls", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    const alice = await call<{ snapshots: { tag: string }[]; pending: { tag: string }[] }>(
      c.gw.url,
      "GET",
      "/v1/snapshots",
      {
        token: "alice-token",
      },
    );
    assert.deepEqual(
      alice.body.snapshots.map((s) => s.tag),
      ["app", "own"],
    );
    assert.deepEqual(alice.body.pending.map((p) => p.tag).sort(), ["writing-on-n1", "writing-on-n2"]);
    const bob = await call<{ snapshots: { tag: string }[] }>(c.gw.url, "GET", "/v1/snapshots", {
      token: "bob-token",
    });
    assert.deepEqual(
      bob.body.snapshots.map((s) => s.tag),
      ["app"],
    );
    const admin = await call<{ snapshots: { tag: string }[] }>(c.gw.url, "GET", "/v1/snapshots", {
      token: "admin-token",
    });
    assert.deepEqual(
      admin.body.snapshots.map((s) => s.tag),
      ["alice/own", "app"],
    );
    assert.equal(
      (await call<{ tag: string }>(c.gw.url, "GET", "/v1/snapshots/own", { token: "alice-token" })).body.tag,
      "own",
    );
    assert.equal(
      (await call(c.gw.url, "GET", "/v1/snapshots/alice%2Fown", { token: "bob-token" })).status,
      404,
    );
    // A tag the catalog does not have yet (being written) is asked of the nodes.
    const writing = await call<{ status: string }>(c.gw.url, "GET", "/v1/snapshots/writing-on-n2", {
      token: "bob-token",
    });
    assert.deepEqual([writing.status, writing.body.status], [200, "writing"]);
    // Deleting goes to a holder (n1), with the caller's token.
    const del = await call<{ node: string; method: string; authorization: string }>(
      c.gw.url,
      "DELETE",
      "/v1/snapshots/own",
      {
        token: "alice-token",
      },
    );
    assert.deepEqual(
      [del.body.node, del.body.method, del.body.authorization],
      ["n1", "DELETE", "Bearer alice-token"],
    );
    // Creating goes to the node with the most room.
    await forkOn(c, "bob-token", 3);
    const made = await call<{ node: string }>(c.gw.url, "POST", "/v1/snapshots", {
      token: "bob-token",
      body: { tag: "x" },
    });
    assert.ok(made.body.node === "n1" || made.body.node === "n2");
  } finally {
    await c.close();
  }
});

test("GET /v1/nodes is the admins'; health counts the caller's sandboxes", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    const r = await call<{
      nodes: { id: string; api: string; holds: { tag: string }[]; capacity: { max_sandboxes: number } }[];
    }>(c.gw.url, "GET", "/v1/nodes", { token: "admin-token" });
    assert.equal(r.status, 200);
    assert.deepEqual(
      r.body.nodes.map((n) => n.id),
      ["n1", "n2"],
    );
    assert.deepEqual(
      r.body.nodes[0]?.holds.map((h) => h.tag),
      ["alice/own", "app"],
    );
    assert.equal(r.body.nodes[0]?.capacity.max_sandboxes, 20);
    assert.equal((await call(c.gw.url, "GET", "/v1/nodes", { token: "bob-token" })).status, 403);
    assert.equal((await call(c.gw.url, "GET", "/metrics", { token: "bob-token" })).status, 403);
    const [one] = await forkOn(c, "alice-token", 2);
    assert.equal(
      (await call(c.gw.url, "GET", `/v1/sandboxes/${one!.id}`, { token: "alice-token" })).status,
      200,
    );
    await until(
      async () =>
        (await call<{ sandboxes: number }>(c.gw.url, "GET", "/v1/health", { token: "alice-token" })).body
          .sandboxes === 2,
    );
    const h = await call<{ ok: boolean; sandboxes: number }>(c.gw.url, "GET", "/v1/health");
    assert.deepEqual([h.body.ok, h.body.sandboxes], [true, 0]);
    const m = await fetch(`${c.gw.url}/metrics`, { headers: { authorization: "Bearer admin-token" } });
    const text = await m.text();
    assert.match(text, /forkd_gateway_placed_total\{node="n\d"\} \d/);
    assert.match(text, /forkd_gateway_proxy_seconds_count/);
  } finally {
    await c.close();
  }
});

test("a terminal WebSocket is relayed to the sandbox's node", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    const sbs = await forkOn(c, "bob-token", 6);
    const sb = sbs.find((s) => s.node === "n2")!;
    const ws = new WebSocket(`${c.gw.url.replace("http", "ws")}/v1/sandboxes/${sb.id}/terminal`, {
      headers: { authorization: "Bearer bob-token" },
    });
    const got = await new Promise<string>((resolve, reject) => {
      ws.on("open", () => ws.send("hello"));
      ws.on("message", (m: Buffer) => resolve(m.toString()));
      ws.on("error", reject);
    });
    ws.close();
    assert.equal(got, `${sb.node}:hello`);
    const refused = new WebSocket(`${c.gw.url.replace("http", "ws")}/v1/sandboxes/${sb.id}/terminal`, {
      headers: { authorization: "Bearer alice-token" },
    });
    const status = await new Promise<number>((resolve) => {
      refused.on("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0));
      refused.on("error", () => resolve(-1));
    });
    assert.equal(status, 404);
  } finally {
    await c.close();
  }
});

test("events: one state of every node's sandboxes and the catalog's snapshots, then each node's events", async () => {
  const c = await fakeCluster({ nodes: 2 });
  try {
    await forkOn(c, "bob-token", 4);
    const ac = new AbortController();
    const res = await fetch(`${c.gw.url}/v1/events`, {
      headers: { authorization: "Bearer bob-token" },
      signal: ac.signal,
    });
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    const reader: ReadableStreamDefaultReader<Uint8Array> = res.body!.getReader();
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
    const state = await next("state");
    assert.equal((state.sandboxes as unknown[]).length, 4);
    assert.deepEqual(
      (state.snapshots as { tag: string }[]).map((s) => s.tag),
      ["app"],
    );
    await forkOn(c, "bob-token", 1);
    const sb = await next("sandbox");
    assert.equal(sb.owner, "bob");
    ac.abort();
    await until(
      () => c.gw.running.gateway.relays.count("n1") + c.gw.running.gateway.relays.count("n2") === 0,
      3000,
      "node streams to close",
    );
  } finally {
    await c.close();
  }
});
