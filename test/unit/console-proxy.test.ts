/**
 * `forkd console`'s server (src/console/server.ts, proxy.ts) in front of a stand-in daemon on a
 * unix socket: the one-time login; a cookie is needed for everything else; a non-GET needs
 * X-Forkd-Console and is forwarded without the console's credentials; a browser that hangs up
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
import { ConsoleSessions } from "../../src/console/sessions.js";

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

async function login(): Promise<string> {
  const r = await call("GET", `/console/login?secret=${sessions.newSecret()}`);
  assert.equal(r.status, 303);
  const cookie = (r.headers["set-cookie"] ?? [])[0] ?? "";
  assert.match(cookie, /HttpOnly; SameSite=Strict; Path=\//);
  return cookie.split(";")[0] ?? "";
}

test("login: once with the secret; refused without it, with a wrong one or a second time", async () => {
  const secret = sessions.newSecret();
  for (const path of ["/console/login", "/console/login?secret=nope", `/console/login?secret=${secret}x`]) {
    const r = await call("GET", path);
    assert.equal(r.status, 401, path);
    assert.match(r.body, /login refused/);
    assert.equal(r.headers["set-cookie"], undefined);
  }
  const ok = await call("GET", `/console/login?secret=${secret}`);
  assert.equal(ok.status, 303);
  assert.equal(ok.headers.location, "/console/");
  const again = await call("GET", `/console/login?secret=${secret}`);
  assert.equal(again.status, 401, "a used secret");
  assert.equal(again.headers["set-cookie"], undefined);
});

test("everything but the login needs the cookie", async () => {
  const page = await call("GET", "/console/");
  assert.equal(page.status, 401);
  const api = await call("GET", "/v1/health");
  assert.equal(api.status, 401);
  assert.equal((JSON.parse(api.body) as { error: { code: string } }).error.code, "unauthenticated");
  assert.equal((await call("GET", "/metrics")).status, 401);
  const cookie = await login();
  const ok = await call("GET", "/console/", { cookie });
  assert.equal(ok.status, 200);
  assert.match(String(ok.headers["content-security-policy"]), /default-src 'self'/);
});

test("a non-GET needs X-Forkd-Console; what is forwarded carries no console credentials", async () => {
  const cookie = await login();
  const refused = await call("POST", "/v1/sandboxes", { cookie, "content-type": "application/json" }, "{}");
  assert.equal(refused.status, 403);
  const n = seen.length;
  const ok = await call(
    "POST",
    "/v1/sandboxes?x=1",
    { cookie, "x-forkd-console": "1", "content-type": "application/json", authorization: "Bearer t" },
    '{"a":1}',
  );
  assert.equal(ok.status, 200);
  assert.deepEqual(JSON.parse(ok.body), { method: "POST", path: "/v1/sandboxes?x=1", body: '{"a":1}' });
  const fwd = seen[n];
  assert.ok(fwd);
  assert.equal(fwd.headers.cookie, undefined);
  assert.equal(fwd.headers["x-forkd-console"], undefined);
  assert.equal(fwd.headers.authorization, undefined);
});

test("a browser that hangs up mid-stream ends the daemon-side request", { timeout: 10_000 }, async () => {
  const cookie = await login();
  const n = seen.length;
  await new Promise<void>((resolve, reject) => {
    const req = request(`${base}/v1/forever`, { headers: { cookie } }, (res) => {
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
  const cookie = await login();
  const how = await new Promise<string>((resolve) => {
    const req = request(`${base}/v1/breaks`, { headers: { cookie } }, (res) => {
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

test("a WebSocket is spliced through from the console's origin, refused from another or without the cookie", async () => {
  const cookie = await login();
  const open = (headers: Record<string, string>) =>
    new Promise<{ status: number } | WebSocket>((resolve, reject) => {
      const ws = new WebSocket(`${base.replace("http", "ws")}/v1/sandboxes/sb-x/terminal`, { headers });
      ws.on("open", () => resolve(ws));
      ws.on("unexpected-response", (_req, res) => resolve({ status: res.statusCode ?? 0 }));
      ws.on("error", reject);
    });
  assert.deepEqual(await open({ cookie, origin: "http://evil.example" }), { status: 403 });
  assert.deepEqual(await open({ origin: base }), { status: 401 });
  const ws = await open({ cookie, origin: base });
  assert.ok(ws instanceof WebSocket);
  const echoed = new Promise<string>((r) => ws.once("message", (m: Buffer) => r(m.toString())));
  ws.send(Buffer.from("hello"));
  assert.equal(await echoed, "hello");
  ws.close();
});

test("logout ends this server's session (the daemon is not asked); another session lives on", async () => {
  const a = await login();
  const b = await login();
  const before = seen.length;
  assert.equal((await call("DELETE", "/v1/console/session", { cookie: a })).status, 403, "needs the header");
  const out = await call("DELETE", "/v1/console/session", { cookie: a, "x-forkd-console": "1" });
  assert.equal(out.status, 200);
  assert.match(out.headers["set-cookie"]?.[0] ?? "", /^forkd_console=; .*Max-Age=0/);
  assert.equal(seen.length, before, "not forwarded");
  assert.equal((await call("GET", "/v1/anything", { cookie: a })).status, 401);
  assert.equal((await call("GET", "/v1/anything", { cookie: b })).status, 200);
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
  const r = await new Promise<IncomingMessage>((resolve, reject) =>
    request(`${origin}/console/login?secret=${s.newSecret()}`, resolve).on("error", reject).end(),
  );
  r.resume();
  const cookie = (r.headers["set-cookie"]?.[0] ?? "").split(";")[0] ?? "";
  assert.match(cookie, /^forkd_console_test=/, "the cookie's name is the server's");
  const ws = new WebSocket(`${origin.replace("http", "ws")}/v1/sandboxes/sb-x/terminal`, {
    headers: { cookie, origin },
  });
  await new Promise<void>((resolve, reject) => {
    ws.on("open", () => resolve());
    ws.on("error", reject);
  });
  const closed = new Promise<void>((res) => ws.on("close", () => res()));
  await stopConsoleServer(server);
  await closed;
});
