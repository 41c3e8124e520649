/**
 * The E2B listener's sandbox plane without VMs (a stand-in guest service on a host port): a
 * credential that does not open a sandbox answers as a missing one (and counts as a failed
 * authentication), the caller's rate and in-flight slots (a streaming reply holds its slot),
 * audit lines for guest-port requests and envd's mutating calls, and a WebSocket upgrade relayed
 * through the listener's `upgrade` event with its refusals closing the socket.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer, request } from "node:http";
import type { IncomingHttpHeaders, Server } from "node:http";
import { connect } from "node:net";
import type { AddressInfo, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { RateLimiter } from "../../src/access/rate-limit.js";
import { Authenticator, TokenStore, credentialOf } from "../../src/access/tokens.js";
import type { AuditRecord } from "../../src/audit/audit-log.js";
import { DEFAULT_BODY_LIMITS } from "../../src/app/body-limits.js";
import { NO_METRICS } from "../../src/app/services.js";
import type { E2bServices as Services } from "../../src/e2b/context.js";
import { AccessTokens } from "../../src/e2b/access-token.js";
import { createE2bHandler, createE2bUpgradeHandler, listenE2b } from "../../src/e2b/server.js";

const ID = "sb-abcdefghijklmnop";
const MISSING = "sb-aaaaaaaaaaaaaaaa";
const quiet = { info: () => undefined, warn: () => undefined };

interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

async function setup() {
  const dir = await mkdtemp(join(tmpdir(), "forkd-e2b-plane-"));
  // The guest's service: /slow answers its headers and then holds its body until released.
  const held: (() => void)[] = [];
  const guest = createServer((req, res) => {
    req.resume();
    if (req.url === "/slow") {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write("started\n");
      held.push(() => res.end("done\n"));
      return;
    }
    res.writeHead(200, { "content-type": "text/plain" });
    res.end(`${req.method ?? ""} ${req.url ?? ""}`);
  });
  guest.on("upgrade", (_req, sock: Socket, head: Buffer) => {
    sock.on("error", () => undefined);
    sock.write("HTTP/1.1 101 Switching Protocols\r\nupgrade: echo\r\nconnection: upgrade\r\n\r\n");
    sock.write(head);
    sock.pipe(sock);
  });
  await new Promise<void>((r) => guest.listen(0, "127.0.0.1", r));
  const gport = (guest.address() as AddressInfo).port;

  const store = new TokenStore(join(dir, "tokens.json"));
  await store.load();
  const created = await store.create({ tenant: "alice", scope: "tenant", e2b: true });
  const key = created.token;
  const accessTokens = AccessTokens.fromSecret(Buffer.alloc(32, 7));
  const sb = {
    record: {
      id: ID,
      owner: "alice",
      e2b: { secure: true },
      network: { ports: { "9000": `127.0.0.1:${gport}` } },
    },
    state: "running",
  };
  const failures: string[] = [];
  const audited: AuditRecord[] = [];
  const services = {
    sandboxes: {
      list: () => [sb],
      get: () => sb,
      exposePort: () => Promise.reject(new Error("nothing listens there")),
    },
    limits: {
      authFailures: { blockedFor: () => 0, fail: (a: string) => void failures.push(a) },
      body: DEFAULT_BODY_LIMITS,
      rate: new RateLimiter({ rps: 0, burst: 1, maxInflight: 1, maxHeavy: 0 }),
    },
    e2b: { auth: new Authenticator(store), accessTokens, domain: null },
    audit: { append: (r: AuditRecord) => void audited.push(r) },
    log: quiet,
    info: { hostDirs: { data: dir }, version: "test" },
    metrics: NO_METRICS,
  } as unknown as Services;
  const server: Server = await listenE2b(
    { host: "127.0.0.1", port: 0, tls: null, maxConnections: 100 },
    createE2bHandler(services),
    createE2bUpgradeHandler(services, { handshakeTimeoutMs: 2_000 }),
  );
  const port = (server.address() as AddressInfo).port;
  const token = accessTokens.of(ID, credentialOf(created.entry.id)) ?? "";

  const call = (
    o: { id?: string; port?: number; method?: string; path?: string; headers?: Record<string, string> } = {},
  ) =>
    new Promise<Reply>((resolve, reject) => {
      const r = request(
        {
          host: "127.0.0.1",
          port,
          method: o.method ?? "GET",
          path: o.path ?? "/",
          headers: {
            "e2b-sandbox-id": o.id ?? ID,
            "e2b-sandbox-port": String(o.port ?? 9000),
            ...o.headers,
          },
        },
        (res) => {
          let body = "";
          res.on("data", (d: Buffer) => (body += d.toString()));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        },
      );
      r.on("error", reject);
      r.end();
    });

  /** A raw upgrade handshake: what the listener sent back, once it closed or `until` matched. */
  const upgrade = (headers: Record<string, string>, send = "", until?: RegExp) =>
    new Promise<string>((resolve) => {
      const sock = connect(port, "127.0.0.1", () => {
        const lines = Object.entries({
          host: "x",
          connection: "upgrade",
          upgrade: "echo",
          "e2b-sandbox-id": ID,
          "e2b-sandbox-port": "9000",
          ...headers,
        })
          .map(([k, v]) => `${k}: ${v}\r\n`)
          .join("");
        sock.write(`GET /ws HTTP/1.1\r\n${lines}\r\n`);
        if (send) sock.write(send);
      });
      let got = "";
      sock.on("data", (d: Buffer) => {
        got += d.toString();
        if (until?.test(got)) sock.destroy();
      });
      sock.on("error", () => undefined);
      sock.on("close", () => resolve(got));
    });

  return {
    key,
    keyId: created.entry.id,
    store,
    accessTokens,
    port,
    token,
    failures,
    audited,
    held,
    call,
    upgrade,
    done: async () => {
      server.closeAllConnections();
      guest.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      await new Promise<void>((r) => guest.close(() => r()));
      await rm(dir, { recursive: true, force: true });
    },
  };
}

const settle = () => new Promise((r) => setTimeout(r, 50));

test("sandbox plane: a credential that does not open a sandbox answers as a missing one, and counts", async () => {
  const t = await setup();
  try {
    const missing = await t.call({ id: MISSING, headers: { "x-access-token": t.token } });
    assert.equal(missing.status, 502);
    const strip = (r: Reply) => r.body.replaceAll(ID, "ID").replaceAll(MISSING, "ID");
    t.failures.length = 0;
    const refused = [
      await t.call({ headers: { "x-access-token": "0".repeat(64) } }),
      await t.call(),
      await t.call({ headers: { "x-api-key": t.key } }),
      await t.call({ headers: { "x-api-key": "e2b_0000" } }),
      await t.call({ port: 49983, path: "/files?path=/etc/passwd&signature=v1_x" }),
    ];
    for (const r of refused) {
      assert.equal(r.status, missing.status);
      assert.equal(strip(r), strip(missing));
    }
    assert.equal(t.failures.length, refused.length, "each refusal a failed authentication");
    assert.equal((await t.call({ headers: { "x-access-token": t.token } })).status, 200);
  } finally {
    await t.done();
  }
});

test("sandbox plane: the caller's slots (a streamed reply holds one), 429 with Retry-After", async () => {
  const t = await setup();
  try {
    const auth = { "x-access-token": t.token };
    // A stream: its headers are in, its body is held by the guest.
    const slow = t.call({ path: "/slow", headers: auth });
    while (t.held.length === 0) await settle();
    const limited = await t.call({ headers: auth });
    assert.equal(limited.status, 429);
    assert.ok(Number(limited.headers["retry-after"]) >= 1);
    assert.match(limited.body, /too many requests in flight/);
    // The owner's slot, whichever credential: an upgrade is refused as well.
    assert.match(await t.upgrade(auth), /^HTTP\/1\.1 429 /);
    t.held.shift()?.();
    assert.equal((await slow).status, 200);
    await settle();
    assert.equal((await t.call({ headers: auth })).status, 200, "the slot is free again");
  } finally {
    await t.done();
  }
});

test("sandbox plane: audit lines for guest ports and envd's mutating calls, refused ones included", async () => {
  const t = await setup();
  try {
    const auth = { "x-access-token": t.token };
    assert.equal((await t.call({ method: "POST", path: "/submit?secret=1", headers: auth })).status, 200);
    await t.call({ port: 49983, method: "POST", path: "/process.Process/Start" });
    await t.call({ port: 49983, path: "/health", headers: auth });
    await settle();
    const lines = t.audited.map((r) => [r.caller, r.action, r.target.id, r.status, r.result]);
    assert.deepEqual(lines, [
      ["alice", "e2b:port POST /submit", ID, 200, "ok"],
      ["anonymous", "e2b:envd POST /process.Process/Start", ID, 502, "502"],
    ]);
    assert.equal(t.audited[0]?.remote, "127.0.0.1");
  } finally {
    await t.done();
  }
});

test("sandbox plane: a WebSocket to a guest port through the listener; refusals close the socket", async () => {
  const t = await setup();
  try {
    const auth = { "x-access-token": t.token };
    const echoed = await t.upgrade(auth, "ping", /ping$/);
    assert.match(echoed, /^HTTP\/1\.1 101 /);
    assert.match(echoed, /\r\n\r\nping$/);
    assert.match(await t.upgrade({}), /^HTTP\/1\.1 502 [^]*was not found/);
    assert.match(
      await t.upgrade({ ...auth, "e2b-sandbox-port": "9001" }),
      /^HTTP\/1\.1 502 [^]*port 9001 is not open/,
    );
    assert.match(await t.upgrade({ ...auth, "e2b-sandbox-port": "49983" }), /^HTTP\/1\.1 404 /);
    assert.match(await t.upgrade({ "e2b-sandbox-id": "nope" }), /^HTTP\/1\.1 404 /);
    await settle();
    const ups = t.audited
      .filter((r) => r.action === "e2b:port UPGRADE /ws")
      .map((r) => r.status)
      .sort();
    assert.deepEqual(ups, [101, 502, 502]);
    // Nothing held: the next request gets the caller's one slot.
    assert.equal((await t.call({ headers: auth })).status, 200);
  } finally {
    await t.done();
  }
});

test("sandbox plane: revoking a key cuts what its access tokens opened (a relayed stream, a WebSocket), then 401", async () => {
  const t = await setup();
  try {
    const auth = { "x-access-token": t.token };
    // A relayed stream, its body held by the guest.
    const stream = new Promise<{ status: number; body: string; cut: boolean }>((resolve, reject) => {
      const r = request(
        {
          host: "127.0.0.1",
          port: t.port,
          path: "/slow",
          headers: { "e2b-sandbox-id": ID, "e2b-sandbox-port": "9000", ...auth },
        },
        (res) => {
          let body = "";
          res.on("data", (d: Buffer) => (body += d.toString()));
          res.on("error", () => undefined);
          res.on("close", () => resolve({ status: res.statusCode ?? 0, body, cut: !res.complete }));
        },
      );
      r.on("error", reject);
      r.end();
    });
    while (t.held.length === 0) await settle();
    t.failures.length = 0;
    await t.store.revoke(t.keyId);
    const cut = await stream;
    assert.equal(cut.status, 200);
    assert.equal(cut.body, "started\n");
    assert.equal(cut.cut, true, "the stream was cut, not ended as if whole");
    const refused = await t.call({ headers: auth });
    assert.equal(refused.status, 401, refused.body);
    assert.match(refused.body, /access token was revoked/);
    assert.deepEqual(t.failures, ["127.0.0.1"], "a revoked token counts as a failed authentication");
    assert.ok(
      t.audited.some((r) => r.action === "e2b:port GET /slow" && r.result === "token_revoked"),
      "the cut is audited",
    );

    // Another key's token of the same sandbox: its WebSocket is cut when that key is revoked.
    const other = await t.store.create({ tenant: "alice", scope: "tenant", e2b: true });
    const token2 = t.accessTokens.of(ID, credentialOf(other.entry.id)) ?? "";
    assert.equal((await t.call({ headers: { "x-access-token": token2 } })).status, 200);
    const sock = connect(t.port, "127.0.0.1");
    sock.on("error", () => undefined);
    let got = "";
    sock.on("data", (d: Buffer) => (got += d.toString()));
    const closed = new Promise<void>((r) => sock.on("close", () => r()));
    sock.write(
      `GET /ws HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: echo\r\n` +
        `e2b-sandbox-id: ${ID}\r\ne2b-sandbox-port: 9000\r\nx-access-token: ${token2}\r\n\r\nping`,
    );
    while (!got.endsWith("ping")) await settle();
    assert.match(got, /^HTTP\/1\.1 101 /);
    await t.store.revoke(other.entry.id);
    await closed; // cut by the revocation (the test's own timeout guards a hang)
    assert.equal((await t.call({ headers: { "x-access-token": token2 } })).status, 401);
  } finally {
    await t.done();
  }
});
