/**
 * The API edge without VMs: bearer tokens (401), admin-only routes (403), tenant scoping of
 * snapshots (another tenant's is 404, exactly like a missing one), body bounds (413, also for a
 * body sent without a length), per-caller limits (429 with Retry-After), the audit line of every
 * mutating call (refused ones too), token management through the API, tenants' build caps (403
 * naming the cap), GET /v1/nodes (a gateway's: one daemon answers 404). Error replies are checked
 * against the committed OpenAPI document.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createApp } from "../../src/api/app.js";
import { contractValidator } from "../helpers/contract.js";
import { fakeSnapshot } from "../helpers/snapshots.js";
import { testServices } from "../helpers/services.js";
import type { TestServices } from "../helpers/services.js";

const ADMIN = "t".repeat(20) + "0123456789abcdef";
let t: TestServices;
let app: ReturnType<typeof createApp>;
let alice = "";
let bob = "";

before(async () => {
  t = await testServices({ body: { json: 4096 } });
  app = createApp(t.services, t.tcp(ADMIN));
  alice = (await t.services.tokens.create({ tenant: "alice", scope: "tenant" })).token;
  bob = (await t.services.tokens.create({ tenant: "bob", scope: "tenant" })).token;
  await fakeSnapshot(t.services.store, "shared", null);
  await fakeSnapshot(t.services.store, "alice-snap", "alice");
  await fakeSnapshot(t.services.store, "bob-snap", "bob");
});

after(async () => {
  await t.cleanup();
});

interface Reply {
  status: number;
  headers: Headers;
  body: { error?: { code: string; message: string } } & Record<string, unknown>;
}

async function call(
  method: string,
  path: string,
  o: {
    token?: string;
    auth?: string;
    json?: unknown;
    raw?: string | ReadableStream<Uint8Array>;
    headers?: Record<string, string>;
    app?: ReturnType<typeof createApp>;
    /** The client's address, as the TCP listener sees it. */
    remote?: string;
  } = {},
): Promise<Reply> {
  const headers: Record<string, string> = { ...o.headers };
  if (o.auth !== undefined) headers.authorization = o.auth;
  else if (o.token !== undefined) headers.authorization = `Bearer ${o.token}`;
  if (o.json !== undefined) headers["content-type"] = "application/json";
  const init: RequestInit & { duplex?: "half" } = {
    method,
    headers,
    body: o.raw ?? (o.json === undefined ? undefined : JSON.stringify(o.json)),
  };
  if (o.raw instanceof ReadableStream) init.duplex = "half"; // a streamed body without a length
  const env = o.remote === undefined ? undefined : { incoming: { socket: { remoteAddress: o.remote } } };
  const res = await (o.app ?? app).request(path, init, env);
  const text = await res.text();
  const body = (text ? JSON.parse(text) : {}) as Reply["body"];
  const v = await contractValidator();
  v.check(method, path, res.status, body);
  return { status: res.status, headers: res.headers, body };
}

test("no token, a malformed or a wrong one is 401 with the envelope; health and the document stay open", async () => {
  assert.equal((await call("GET", "/v1/health")).status, 200);
  assert.equal((await call("GET", "/v1/openapi.json")).status, 200);
  for (const auth of [
    undefined,
    "",
    "Bearer",
    `Bearer ${ADMIN}x`,
    `Bearer ${ADMIN.slice(1)}`,
    ADMIN,
    `Basic ${ADMIN}`,
    `Bearer ${alice}x`,
    `Bearer ${"a".repeat(600)}`,
  ]) {
    const r = await call("GET", "/v1/sandboxes", auth === undefined ? {} : { auth });
    assert.equal(r.status, 401, String(auth));
    assert.equal(r.body.error?.code, "unauthenticated");
    assert.match(r.headers.get("www-authenticate") ?? "", /^Bearer/);
  }
  assert.equal((await call("GET", "/v1/sandboxes", { token: ADMIN })).status, 200);
  assert.equal((await call("GET", "/v1/sandboxes", { auth: `bearer ${alice}` })).status, 200);
});

test("tenants see shared snapshots and their own; another tenant's is 404 like a missing one", async () => {
  const names = async (token: string) =>
    ((await call("GET", "/v1/snapshots", { token })).body.snapshots as { tag: string }[])
      .map((m) => m.tag)
      .sort();
  assert.deepEqual(await names(alice), ["alice-snap", "shared"]);
  assert.deepEqual(await names(bob), ["bob-snap", "shared"]);
  assert.deepEqual(await names(ADMIN), ["alice-snap", "bob-snap", "shared"]);

  const foreign = await call("GET", "/v1/snapshots/bob-snap", { token: alice });
  const missing = await call("GET", "/v1/snapshots/no-such", { token: alice });
  assert.equal(foreign.status, 404);
  assert.equal(foreign.body.error?.message, "no snapshot tagged bob-snap");
  assert.equal(missing.body.error?.message, "no snapshot tagged no-such");
  for (const [m, p] of [
    ["GET", "/v1/snapshots/bob-snap/info"],
    ["GET", "/v1/snapshots/bob-snap/pack"],
    ["DELETE", "/v1/snapshots/bob-snap"],
  ] as const) {
    assert.equal((await call(m, p, { token: alice })).status, 404, `${m} ${p}`);
  }
  const fork = await call("POST", "/v1/sandboxes", { token: alice, json: { snapshot_tag: "bob-snap" } });
  assert.equal(fork.status, 404);
  assert.equal(fork.body.error?.message, "no snapshot tagged bob-snap");

  assert.equal((await call("GET", "/v1/snapshots/shared", { token: alice })).status, 200);
  const del = await call("DELETE", "/v1/snapshots/shared", { token: alice });
  assert.equal(del.status, 403);
  assert.equal(del.body.error?.code, "forbidden");
  assert.equal((await call("DELETE", "/v1/snapshots/alice-snap", { token: alice })).status, 200);
  assert.equal(await t.services.store.has("alice-snap"), false);
  assert.equal(await t.services.store.has("bob-snap"), true);
});

test("tenants get 403 on admin-only routes; an admin manages tokens through the API", async () => {
  for (const [m, p] of [
    ["GET", "/metrics"],
    ["GET", "/v1/tokens"],
  ] as const) {
    const r = await app.request(p, { method: m, headers: { authorization: `Bearer ${alice}` } });
    assert.equal(r.status, 403, p);
  }
  assert.equal((await call("POST", "/v1/tokens", { token: bob, json: { tenant: "bob" } })).status, 403);
  const made = await call("POST", "/v1/tokens", { token: ADMIN, json: { tenant: "carol" } });
  assert.equal(made.status, 201);
  const carol = made.body.token as string;
  const info = made.body.info as { id: string; tenant: string; scope: string };
  assert.deepEqual([info.tenant, info.scope], ["carol", "tenant"]);
  assert.equal((await call("GET", "/v1/sandboxes", { token: carol })).status, 200);
  const listed = (await call("GET", "/v1/tokens", { token: ADMIN })).body.tokens as Record<string, unknown>[];
  assert.ok(listed.some((x) => x.id === info.id));
  assert.ok(
    listed.every((x) => !("sha256" in x) && !("token" in x)),
    "no secret or hash is ever listed",
  );
  assert.equal((await call("DELETE", `/v1/tokens/${info.id}`, { token: ADMIN })).status, 200);
  assert.equal((await call("GET", "/v1/sandboxes", { token: carol })).status, 401);
  assert.equal(
    (await call("POST", "/v1/tokens", { token: ADMIN, json: { tenant: "Bad Name" } })).status,
    400,
  );
});

test("GET /v1/nodes: one daemon answers 404 (a tenant 403, as on a gateway); a cluster node sends to a gateway", async () => {
  const alone = await call("GET", "/v1/nodes", { token: ADMIN });
  assert.equal(alone.status, 404);
  assert.equal(alone.body.error?.code, "not_found");
  assert.match(alone.body.error?.message ?? "", /this is one daemon, not a cluster/);
  assert.equal((await call("GET", "/v1/nodes", { token: alice })).status, 403);
  const node = createApp({ ...t.services, info: { ...t.services.info, node: "n1" } }, t.tcp(ADMIN));
  const onNode = await call("GET", "/v1/nodes", { token: ADMIN, app: node });
  assert.equal(onNode.status, 404);
  assert.match(onNode.body.error?.message ?? "", /this is node n1 of a cluster: ask a gateway/);
});

test("a pull from a peer node is an admin's; without a cluster secret it is unavailable", async () => {
  const body = { peer: "http://127.0.0.1:9", tag: "alice/app" };
  assert.equal((await call("POST", "/v1/snapshots/pull", { token: alice, json: body })).status, 403);
  const noSecret = await call("POST", "/v1/snapshots/pull", { token: ADMIN, json: body });
  assert.equal(noSecret.status, 503, JSON.stringify(noSecret.body));
  assert.match(noSecret.body.error?.message ?? "", /FORKD_CLUSTER_SECRET_FILE/);
  for (const json of [{ peer: "http://127.0.0.1:9" }, { ...body, ref: "h/n:t" }, { peer: [], tag: "x" }]) {
    const r = await call("POST", "/v1/snapshots/pull", { token: ADMIN, json });
    assert.equal(r.status, 400, JSON.stringify(json));
  }
});

test("bodies over their bound are 413 before anything runs, with or without a declared length", async () => {
  const big = JSON.stringify({ snapshot_tag: "shared", metadata: { k: "x".repeat(8000) } });
  const declared = await call("POST", "/v1/sandboxes", {
    token: ADMIN,
    raw: big,
    headers: { "content-type": "application/json" },
  });
  assert.equal(declared.status, 413);
  assert.equal(declared.body.error?.code, "payload_too_large");
  const chunks = new ReadableStream<Uint8Array>({
    start(c) {
      for (let i = 0; i < 8; i++) c.enqueue(new TextEncoder().encode(big.slice(i * 1000, (i + 1) * 1000)));
      c.enqueue(new TextEncoder().encode(big.slice(8000)));
      c.close();
    },
  });
  const streamed = await call("POST", "/v1/sandboxes", {
    token: ADMIN,
    raw: chunks,
    headers: { "content-type": "application/json" },
  });
  assert.equal(streamed.status, 413);
  assert.equal(t.services.sandboxes.list().length, 0);
});

test("a caller past its rate or its heavy operations in flight gets 429 with Retry-After; others are not slowed", async () => {
  const limited = await testServices({ rate: { rps: 5, burst: 5, maxHeavy: 1 } });
  try {
    const lapp = createApp(limited.services, limited.tcp(ADMIN));
    const token = (await limited.services.tokens.create({ tenant: "dave", scope: "tenant" })).token;
    const lcall = (m: string, p: string, o: Parameters<typeof call>[2] = {}) =>
      call(m, p, { ...o, app: lapp });
    const statuses: number[] = [];
    let retry: string | null = null;
    for (let i = 0; i < 8; i++) {
      const r = await lcall("GET", "/v1/version", { token });
      statuses.push(r.status);
      if (r.status === 429) {
        retry = r.headers.get("retry-after");
        assert.equal(r.body.error?.code, "rate_limited");
      }
    }
    assert.deepEqual(statuses.slice(0, 5), [200, 200, 200, 200, 200]);
    assert.ok(statuses.includes(429), statuses.join());
    assert.ok(Number(retry) >= 1);
    assert.equal((await lcall("GET", "/v1/version", { token: ADMIN })).status, 200);

    // A heavy operation held open (an unpack whose body has not ended) takes the only slot.
    let end = () => undefined as void;
    const body = new ReadableStream<Uint8Array>({
      start(ctl) {
        ctl.enqueue(new Uint8Array([1, 2, 3]));
        end = () => ctl.close();
      },
    });
    const held = lcall("POST", "/v1/snapshots/unpack", { token: ADMIN, raw: body });
    await new Promise((r) => setTimeout(r, 200));
    const second = await lcall("POST", "/v1/snapshots/unpack", { token: ADMIN, raw: "x" });
    assert.equal(second.status, 429);
    assert.match(second.body.error?.message ?? "", /heavy operations in flight/);
    end();
    assert.equal((await held).status, 400); // not a pack; the slot is free again
    assert.equal((await lcall("POST", "/v1/snapshots/unpack", { token: ADMIN, raw: "x" })).status, 400);
  } finally {
    await limited.cleanup();
  }
});

test("failed authentications are limited per address: 429 with Retry-After, before any token is checked", async () => {
  const limited = await testServices({ authFailures: { rps: 0.01, burst: 3 } });
  try {
    const lapp = createApp(limited.services, limited.tcp(ADMIN));
    const from = (remote: string, o: Parameters<typeof call>[2] = {}) =>
      call("GET", "/v1/sandboxes", { ...o, app: lapp, remote });
    const mallory = "203.0.113.7";
    assert.equal((await from(mallory, { token: "nope" })).status, 401);
    assert.equal((await from(mallory)).status, 401, "no token on a protected route counts too");
    assert.equal((await call("GET", "/v1/health", { app: lapp, remote: mallory, token: "x" })).status, 200);
    const refused = await from(mallory, { token: "nope" });
    assert.equal(refused.status, 429);
    assert.equal(refused.body.error?.code, "rate_limited");
    assert.match(refused.body.error?.message ?? "", /failed authentications from this address/);
    assert.ok(Number(refused.headers.get("retry-after")) >= 1);
    // While blocked, the right token gets the same reply: a guess cannot be confirmed.
    assert.equal((await from(mallory, { token: ADMIN })).status, 429);
    assert.equal((await call("GET", "/v1/health", { app: lapp, remote: mallory, token: ADMIN })).status, 429);
    // Health without a credential is no attempt; other addresses are not slowed.
    assert.equal((await call("GET", "/v1/health", { app: lapp, remote: mallory })).status, 200);
    assert.equal((await from("203.0.113.8", { token: ADMIN })).status, 200);
    assert.equal((await from("203.0.113.8", { token: "nope" })).status, 401);
    // Valid tokens never count as failures.
    for (let i = 0; i < 10; i++) assert.equal((await from("198.51.100.1", { token: ADMIN })).status, 200);
    // The refusals are audited like any mutating call.
    assert.equal(
      (await call("POST", "/v1/tokens", { app: lapp, remote: mallory, token: "nope", json: {} })).status,
      429,
    );
    assert.ok(
      limited.audited.some(
        (a) => a.status === 429 && a.result === "rate_limited" && a.action === "POST /v1/tokens",
      ),
    );
    // The unix socket (no authentication) is never limited.
    const local = createApp(limited.services);
    assert.equal((await call("GET", "/v1/sandboxes", { app: local, remote: mallory })).status, 200);
  } finally {
    await limited.cleanup();
  }
});

test("a tenant asking for more than its build caps is 403 naming the cap; a token's own caps hold; admins have none", async () => {
  const refused = (r: Reply, cap: string, limit: number) => {
    assert.equal(r.status, 403, JSON.stringify(r.body));
    assert.equal(r.body.error?.code, "forbidden");
    assert.match(r.body.error?.message ?? "", new RegExp(`\\(${cap}\\)`));
    assert.deepEqual((r.body.error as { details?: unknown }).details, {
      field: cap === "max_memory_mib" ? "memory_mib" : "vcpus",
      cap,
      limit,
    });
  };
  // The operator's defaults (src/access/build-caps.ts): 4096 MiB and 4 vCPUs.
  refused(
    await call("POST", "/v1/snapshots", { token: alice, json: { tag: "big", memory_mib: 65536 } }),
    "max_memory_mib",
    4096,
  );
  refused(
    await call("POST", "/v1/snapshots", { token: alice, json: { tag: "big", vcpus: 32 } }),
    "max_vcpus",
    4,
  );
  refused(
    await call("POST", "/v1/snapshots/build?tag=big&memory_mib=8192", { token: alice }),
    "max_memory_mib",
    4096,
  );
  refused(await call("POST", "/v1/snapshots/build?tag=big&vcpus=5", { token: alice }), "max_vcpus", 4);
  // A token's own caps, set by an admin, listed with it.
  const made = await call("POST", "/v1/tokens", {
    token: ADMIN,
    json: { tenant: "dave", max_memory_mib: 256, max_vcpus: 1, max_build_disk_mib: 64 },
  });
  assert.equal(made.status, 201);
  const dave = made.body.token as string;
  const info = made.body.info as Record<string, unknown>;
  assert.deepEqual([info.max_memory_mib, info.max_vcpus, info.max_build_disk_mib], [256, 1, 64]);
  refused(
    await call("POST", "/v1/snapshots/build?tag=big&memory_mib=512", { token: dave }),
    "max_memory_mib",
    256,
  );
  refused(
    await call("POST", "/v1/snapshots", { token: dave, json: { tag: "big", memory_mib: 256, vcpus: 2 } }),
    "max_vcpus",
    1,
  );
  // Within the caps the request goes on (here to the unknown template).
  const within = await call("POST", "/v1/snapshots", {
    token: dave,
    json: { tag: "small", template: "nope", memory_mib: 256 },
  });
  assert.equal(within.status, 400, JSON.stringify(within.body));
  // An admin is not capped by the tenants' caps.
  const admin = await call("POST", "/v1/snapshots", {
    token: ADMIN,
    json: { tag: "big", template: "nope", memory_mib: 65536, vcpus: 32 },
  });
  assert.equal(admin.status, 400, JSON.stringify(admin.body));
  assert.match(admin.body.error?.message ?? "", /nope/);
  await call("DELETE", `/v1/tokens/${info.id as string}`, { token: ADMIN });
});

test("every mutating call leaves one audit line with caller, action, target, status and result", async () => {
  t.audited.length = 0;
  await call("DELETE", "/v1/snapshots/bob-snap", { token: alice }); // refused: not hers (404)
  await call("POST", "/v1/sandboxes", {}); // refused: no token
  await call("DELETE", "/v1/snapshots/bob-snap", { token: bob }); // done
  await call("GET", "/v1/snapshots", { token: bob }); // not mutating: no line
  assert.deepEqual(
    t.audited.map((a) => [a.caller, a.action, a.target.tag ?? null, a.status, a.result]),
    [
      ["alice", "DELETE /v1/snapshots/{tag}", "bob-snap", 404, "not_found"],
      ["anonymous", "POST /v1/sandboxes", null, 401, "unauthenticated"],
      ["bob", "DELETE /v1/snapshots/{tag}", "bob-snap", 200, "ok"],
    ],
  );
  for (const a of t.audited) {
    assert.match(a.request_id, /^[0-9a-f-]{36}$/);
    assert.ok(a.duration_ms >= 0 && !Number.isNaN(Date.parse(a.ts)));
  }
  assert.match(t.audited[2]?.token ?? "", /^tok-/);
});
