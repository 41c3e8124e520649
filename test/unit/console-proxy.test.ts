/**
 * `forkd console`'s server (src/console/server.ts, proxy.ts) in front of a stand-in daemon on a
 * unix socket: the one-time login (the URL's secret goes to the page, which posts it and gets the
 * cookie and the session's key); every API call needs the cookie with its key (or a ticket, once,
 * on a GET or an upgrade): a cookie alone, stolen from another port of the host, opens nothing,
 * even with X-Forkd-Console: 1; a non-GET needs X-Forkd-Console and is forwarded without the
 * console's credentials; a browser that hangs up
 * mid-stream ends the daemon-side request, and a daemon reply that breaks off ends the
 * browser's; WebSocket upgrades are spliced through, and refused from another origin; logout
 * ends the session here; stopping the server ends its open WebSockets.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { WebSocket, WebSocketServer } from "ws";
import { createConsoleServer, stopConsoleServer } from "../../src/console/server.js";
import { ConsoleSessions } from "../../src/access/console-sessions.js";

let dir: string;
let upstream: Server;
let consoleServer: Server;
let base: string;
let sessions: ConsoleSessions;
/** What the stand-in daemon saw, per path. */
const seen: { path: string; headers: IncomingMessage["headers"]; closed: Promise<void> }[] = [];
const wss = new WebSocketServer({ noServer: true });

function daemon(req: IncomingMessage, res: ServerResponse): void {
  const closed = new Promise<void>((r) => res.on("close", () => r()));
  seen.push({ path: req.url ?? "", headers: req.headers, closed });
  if (req.url === "/v1/forever") {
    // An event stream that never ends on its own.
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write("event: state\ndata: {}\n\n");
    const t = setInterval(() => res.write(": ping\n\n"), 20);
    res.on("close", () => clearInterval(t));
    return;
  }
  if (req.url === "/v1/breaks") {
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    res.write('{"type":"started"}\n');
    setTimeout(() => res.destroy(), 50);
    return;
  }
  let body = "";
  req.on("data", (d: Buffer) => (body += d.toString()));
  req.on("end", () => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ method: req.method, path: req.url, body }));
  });
}

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "forkd-console-proxy-"));
  await mkdir(join(dir, "dist"));
  await writeFile(join(dir, "dist", "index.html"), "<!doctype html><title>console</title>");
  upstream = createServer(daemon);
  upstream.on("upgrade", (req, socket, head) =>
    wss.handleUpgrade(req, socket, head, (ws) => ws.on("message", (m, bin) => ws.send(m, { binary: bin }))),
  );
  await new Promise<void>((r) => upstream.listen(join(dir, "d.sock"), r));
  sessions = new ConsoleSessions();
  let origin = "";
  consoleServer = createConsoleServer({
    socket: join(dir, "d.sock"),
    dist: join(dir, "dist"),
    sessions,
    origin: () => origin,
  });
  await new Promise<void>((r) => consoleServer.listen(0, "127.0.0.1", r));
  const a = consoleServer.address();
  base = origin = `http://127.0.0.1:${a && typeof a === "object" ? a.port : 0}`;
});

after(async () => {
  consoleServer.closeAllConnections();
  upstream.closeAllConnections();
  await new Promise<void>((r) => consoleServer.close(() => r()));
  await new Promise<void>((r) => upstream.close(() => r()));
  wss.close();
  await rm(dir, { recursive: true, force: true });
});

interface Reply {
  status: number;
  headers: IncomingMessage["headers"];
  body: string;
}

function call(
  method: string,
  path: string,
  headers: Record<string, string> = {},
  body?: string,
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request(`${base}${path}`, { method, headers }, (res) => {
      let b = "";
      res.on("data", (d: Buffer) => (b += d.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: b }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

type Creds = { cookie: string; "x-forkd-console-key": string };

/** Logs in as the page does: the printed URL's secret, posted; the cookie and the reply's key. */
async function login(): Promise<Creds> {
  const secret = sessions.newSecret();
  const r = await call("GET", `/console/login?secret=${secret}`);
  assert.equal(r.status, 303);
  assert.equal(r.headers.location, `/console/#login=${secret}`);
  assert.equal(r.headers["set-cookie"], undefined, "the redirect itself logs nobody in");
  const p = await call(
    "POST",
    "/v1/console/session",
    { "x-forkd-console": "1", "content-type": "application/json" },
    JSON.stringify({ secret }),
  );
  assert.equal(p.status, 200);
  const cookie = (p.headers["set-cookie"] ?? [])[0] ?? "";
  assert.match(cookie, /HttpOnly; SameSite=Strict; Path=\//);
  const body = JSON.parse(p.body) as { key: string; caller: { kind: string } };
  assert.equal(body.caller.kind, "local");
  return { cookie: cookie.split(";")[0] ?? "", "x-forkd-console-key": body.key };
}

async function ticket(c: Creds): Promise<string> {
  const r = await call("POST", "/v1/console/ticket", { ...c, "x-forkd-console": "1" });
  assert.equal(r.status, 200);
  return (JSON.parse(r.body) as { ticket: string }).ticket;
}

test("login: once with the secret; refused without it, with a wrong one, a second time or without the header", async () => {
  const secret = sessions.newSecret();
  for (const path of [
    "/console/login",
    "/console/login?secret=",
    "/console/login?secret=no%20pe",
    "/console/login?secret=nope",
    `/console/login?secret=${secret}x`,
  ]) {
    const r = await call("GET", path);
    assert.equal(r.status, 401, path);
    assert.match(r.body, /login refused/);
  }
  const post = (body: unknown, headers: Record<string, string> = { "x-forkd-console": "1" }) =>
    call(
      "POST",
      "/v1/console/session",
      { ...headers, "content-type": "application/json" },
      JSON.stringify(body),
    );
  for (const bad of [{ secret: `${secret}x` }, { secret: "nope" }, {}, { secret: 1 }]) {
    const r = await post(bad);
    assert.equal(r.status, 401, JSON.stringify(bad));
    assert.equal(r.headers["set-cookie"], undefined);
  }
  const noHeader = await post({ secret }, {});
  assert.equal(noHeader.status, 403, "a cross-site form cannot log the browser in");
  assert.equal(noHeader.headers["set-cookie"], undefined);
  const ok = await post({ secret });
  assert.equal(ok.status, 200);
  assert.ok(ok.headers["set-cookie"]);
  const again = await post({ secret });
  assert.equal(again.status, 401, "a used secret");
  assert.equal(again.headers["set-cookie"], undefined);
  assert.equal((await call("GET", `/console/login?secret=${secret}`)).status, 401, "its URL is refused too");
});

test("the assets need nothing; every API call needs the session", async () => {
  const page = await call("GET", "/console/");
  assert.equal(page.status, 200, "the front end holds no data");
  assert.match(String(page.headers["content-security-policy"]), /default-src 'self'/);
  const api = await call("GET", "/v1/health");
  assert.equal(api.status, 401);
  assert.equal((JSON.parse(api.body) as { error: { code: string } }).error.code, "unauthenticated");
  assert.equal((await call("GET", "/metrics")).status, 401);
  const c = await login();
  assert.equal((await call("GET", "/v1/health", c)).status, 200);
  assert.equal((await call("GET", "/metrics", c)).status, 200);
});

test("a stolen cookie replayed with X-Forkd-Console: 1 but without the page's key opens nothing: no token minted", async () => {
  const c = await login();
  const n = seen.length;
  const replays: Record<string, string>[] = [
    { cookie: c.cookie },
    { cookie: c.cookie, "x-forkd-console-key": "1" },
  ];
  for (const stolen of replays) {
    const mint = await call(
      "POST",
      "/v1/tokens",
      { ...stolen, "x-forkd-console": "1", "content-type": "application/json" },
      '{"tenant":"mallory","scope":"admin"}',
    );
    assert.equal(mint.status, 401, JSON.stringify(stolen));
    assert.equal((await call("GET", "/v1/tokens", stolen)).status, 401);
    assert.equal(
      (await call("POST", "/v1/console/ticket", { ...stolen, "x-forkd-console": "1" })).status,
      401,
    );
  }
  assert.equal(seen.length, n, "the daemon was asked nothing");
  // The page, with its key, still works.
  const ok = await call(
    "POST",
    "/v1/tokens",
    { ...c, "x-forkd-console": "1", "content-type": "application/json" },
    '{"tenant":"t"}',
  );
  assert.equal(ok.status, 200);
  assert.equal(seen.length, n + 1);
});

test("a ticket stands for the key once, on a GET, and is not forwarded", async () => {
  const c = await login();
  const t = await ticket(c);
  const n = seen.length;
  assert.equal((await call("GET", `/v1/events?a=1&console_ticket=${t}`, { cookie: c.cookie })).status, 200);
  assert.equal(seen[n]?.path, "/v1/events?a=1");
  assert.equal(
    (await call("GET", `/v1/events?console_ticket=${t}`, { cookie: c.cookie })).status,
    401,
    "once",
  );
  const t2 = await ticket(c);
  assert.equal((await call("GET", `/v1/events?console_ticket=${t2}`)).status, 401, "with its cookie only");
  const t3 = await ticket(c);
  const post = await call("POST", `/v1/x?console_ticket=${t3}`, { cookie: c.cookie, "x-forkd-console": "1" });
  assert.equal(post.status, 401, "GETs only");
});

test("a non-GET needs X-Forkd-Console; what is forwarded carries no console credentials", async () => {
  const c = await login();
  const refused = await call("POST", "/v1/sandboxes", { ...c, "content-type": "application/json" }, "{}");
  assert.equal(refused.status, 403);
  const n = seen.length;
  const ok = await call(
    "POST",
    "/v1/sandboxes?x=1",
    { ...c, "x-forkd-console": "1", "content-type": "application/json", authorization: "Bearer t" },
    '{"a":1}',
  );
  assert.equal(ok.status, 200);
  assert.deepEqual(JSON.parse(ok.body), { method: "POST", path: "/v1/sandboxes?x=1", body: '{"a":1}' });
  const fwd = seen[n];
  assert.ok(fwd);
  assert.equal(fwd.headers.cookie, undefined);
  assert.equal(fwd.headers["x-forkd-console"], undefined);
  assert.equal(fwd.headers["x-forkd-console-key"], undefined);
  assert.equal(fwd.headers.authorization, undefined);
});

test("a browser that hangs up mid-stream ends the daemon-side request", { timeout: 10_000 }, async () => {
  const c = await login();
  const n = seen.length;
  await new Promise<void>((resolve, reject) => {
    const req = request(`${base}/v1/forever`, { headers: c }, (res) => {
      assert.equal(res.headers["content-type"], "text/event-stream");
      res.once("data", () => {
        req.destroy();
        resolve();
      });
    });
    req.on("error", () => undefined);
    req.on("close", () => resolve());
    req.setTimeout(10_000, () => reject(new Error("no event arrived")));
    req.end();
  });
  const up = seen[n];
  assert.ok(up);
  await up.closed; // within the test's timeout: the daemon-side request must close
});

test("a daemon reply that breaks off ends the browser's", async () => {
  const c = await login();
  const how = await new Promise<string>((resolve) => {
    const req = request(`${base}/v1/breaks`, { headers: c }, (res) => {
      res.on("data", () => undefined);
      res.on("end", () => resolve("end"));
      res.on("error", () => resolve("error"));
      res.on("aborted", () => resolve("aborted"));
    });
    req.on("error", () => resolve("error"));
    req.end();
  });
  assert.notEqual(how, "end", "a broken reply must not look complete");
});

test("a WebSocket (with a ticket) is spliced through from the console's origin, refused from another, with the cookie alone or a used ticket", async () => {
  const c = await login();
  const { cookie } = c;
  const open = async (headers: Record<string, string>, t?: string) =>
    new Promise<{ status: number } | WebSocket>((resolve, reject) => {
      const q = t === undefined ? "" : `?console_ticket=${t}`;
      const ws = new WebSocket(`${base.replace("http", "ws")}/v1/sandboxes/sb-x/terminal${q}`, { headers });
      ws.on("open", () => resolve(ws));
      ws.on("unexpected-response", (_req, res) => resolve({ status: res.statusCode ?? 0 }));
      ws.on("error", reject);
    });
  assert.deepEqual(await open({ cookie, origin: "http://evil.example" }, await ticket(c)), { status: 403 });
  assert.deepEqual(await open({ origin: base }, await ticket(c)), { status: 401 });
  assert.deepEqual(await open({ cookie, origin: base }), { status: 401 }, "the cookie alone");
  const t = await ticket(c);
  const ws = await open({ cookie, origin: base }, t);
  assert.ok(ws instanceof WebSocket);
  const echoed = new Promise<string>((r) => ws.once("message", (m: Buffer) => r(m.toString())));
  ws.send(Buffer.from("hello"));
  assert.equal(await echoed, "hello");
  ws.close();
  assert.deepEqual(await open({ cookie, origin: base }, t), { status: 401 }, "a used ticket");
});

test("logout ends this server's session (the daemon is not asked); another session lives on", async () => {
  const a = await login();
  const b = await login();
  const before = seen.length;
  assert.equal((await call("DELETE", "/v1/console/session", a)).status, 403, "needs the header");
  assert.equal(
    (await call("DELETE", "/v1/console/session", { cookie: a.cookie, "x-forkd-console": "1" })).status,
    401,
    "the cookie alone ends nothing",
  );
  const out = await call("DELETE", "/v1/console/session", { ...a, "x-forkd-console": "1" });
  assert.equal(out.status, 200);
  assert.match(out.headers["set-cookie"]?.[0] ?? "", /^forkd_console=; .*Max-Age=0/);
  assert.equal(seen.length, before, "not forwarded");
  assert.equal((await call("GET", "/v1/anything", a)).status, 401);
  assert.equal((await call("GET", "/v1/anything", b)).status, 200);
});

test("stopConsoleServer ends open WebSockets instead of waiting for them", { timeout: 10_000 }, async () => {
  const s = new ConsoleSessions();
  let origin = "";
  const server = createConsoleServer({
    socket: join(dir, "d.sock"),
    dist: join(dir, "dist"),
    sessions: s,
    origin: () => origin,
    cookie: () => "forkd_console_test",
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const a = server.address();
  origin = `http://127.0.0.1:${a && typeof a === "object" ? a.port : 0}`;
  const secret = s.newSecret();
  const r = await fetch(`${origin}/v1/console/session`, {
    method: "POST",
    headers: { "x-forkd-console": "1", "content-type": "application/json" },
    body: JSON.stringify({ secret }),
  });
  const cookie = (r.headers.get("set-cookie") ?? "").split(";")[0] ?? "";
  const { key } = (await r.json()) as { key: string };
  assert.match(cookie, /^forkd_console_test=/, "the cookie's name is the server's");
  const t = await fetch(`${origin}/v1/console/ticket`, {
    method: "POST",
    headers: { cookie, "x-forkd-console": "1", "x-forkd-console-key": key },
  });
  const { ticket: tk } = (await t.json()) as { ticket: string };
  const ws = new WebSocket(
    `${origin.replace("http", "ws")}/v1/sandboxes/sb-x/terminal?console_ticket=${tk}`,
    {
      headers: { cookie, origin },
    },
  );
  await new Promise<void>((resolve, reject) => {
    ws.on("open", () => resolve());
    ws.on("error", reject);
  });
  const closed = new Promise<void>((res) => ws.on("close", () => res()));
  await stopConsoleServer(server);
  await closed;
});
