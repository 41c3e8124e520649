/**
 * The daemon's one reverse proxy (src/http/proxy-request.ts, proxy-upgrade.ts, proxy-headers.ts),
 * what both doors (E2B's guest ports, the console) now share, where a door did less before:
 * headers the Connection header names and Proxy-Authorization are hop-by-hop; this daemon's
 * credential headers and console cookies never go upstream whatever the door's rule; a status
 * node will not send is the door's 502, not a throw (the console's proxy threw); a pooled
 * upstream connection is not held to the connect bound (a guest's second request on a kept
 * connection was cut after 10 s); an upgrade's refusal is relayed with its body; one that is not
 * answered in time is the door's 504.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { connect, createServer as createNetServer } from "node:net";
import { proxyRequest } from "../../src/http/proxy-request.js";
import type { ProxyRequestOptions } from "../../src/http/proxy-request.js";
import { proxyUpgrade } from "../../src/http/proxy-upgrade.js";

const listen = async (srv: Server | ReturnType<typeof createNetServer>) => {
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  return (srv.address() as AddressInfo).port;
};
const close = async (srv: Server) => {
  srv.closeAllConnections();
  await new Promise<void>((r) => srv.close(() => r()));
};

const refusal = (status: number, why: string) => ({ body: JSON.stringify({ status, why }) });

/** A front proxying to `port` with `o`, and a GET of it. */
async function front(port: number, o: Partial<ProxyRequestOptions> = {}) {
  const srv = createServer((req, res) =>
    proxyRequest(req, res, { host: "127.0.0.1", port }, { name: "upstream", refusal, ...o }),
  );
  const fport = await listen(srv);
  const get = (headers: Record<string, string> = {}, path = "/") =>
    new Promise<{ status: number; headers: IncomingMessage["headers"]; body: string }>((resolve, reject) => {
      const r = request({ host: "127.0.0.1", port: fport, path, headers }, (res) => {
        let body = "";
        res.on("data", (d: Buffer) => (body += d.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        res.on("error", reject);
      });
      r.on("error", reject);
      r.end();
    });
  return { srv, fport, get };
}

test("proxy: hop-by-hop (also what Connection names) and our credentials never pass; the door's rule then applies", async () => {
  const up = createServer((req: IncomingMessage, res: ServerResponse) => {
    res.writeHead(200, {
      "content-type": "application/json",
      connection: "x-reply-hop",
      "x-reply-hop": "1",
      "x-reply": "kept",
      "x-drop-reply": "1",
    });
    res.end(JSON.stringify(req.headers));
  });
  const f = await front(await listen(up), {
    keep: (n, v) => (n === "x-door-drops" ? null : v),
    keepReply: (n, v) => (n === "x-drop-reply" ? null : v),
  });
  try {
    const r = await f.get({
      connection: "x-hop",
      "x-hop": "1",
      "proxy-authorization": "Basic eDp5",
      "x-access-token": "t",
      "x-api-key": "k",
      "x-forkd-console": "1",
      "x-forkd-console-key": "ck",
      cookie: "forkd_console=s; app=1; forkd_console_4242=s2",
      "x-door-drops": "1",
      "x-kept": "yes",
    });
    assert.equal(r.status, 200);
    const seen = JSON.parse(r.body) as Record<string, string>;
    for (const h of [
      "x-hop",
      "proxy-authorization",
      "x-access-token",
      "x-api-key",
      "x-forkd-console",
      "x-forkd-console-key",
      "x-door-drops",
    ])
      assert.equal(seen[h], undefined, `${h} went upstream`);
    assert.equal(seen.cookie, "app=1");
    assert.equal(seen["x-kept"], "yes");
    assert.equal(r.headers["x-reply-hop"], undefined);
    assert.equal(r.headers["x-drop-reply"], undefined);
    assert.equal(r.headers["x-reply"], "kept");
  } finally {
    await close(f.srv);
    await close(up);
  }
});

test("proxy: a status node will not send is the door's 502; an unreachable upstream too", async () => {
  const raw = createNetServer((sock) => {
    sock.on("error", () => undefined);
    sock.once("data", () => sock.end("HTTP/1.1 042 X\r\ncontent-length: 2\r\n\r\nhi"));
  });
  const f = await front(await listen(raw));
  const dead = createServer();
  const deadPort = await listen(dead);
  await close(dead);
  const g = await front(deadPort);
  try {
    const r = await f.get();
    assert.equal(r.status, 502);
    assert.match(r.body, /upstream answered status 42/);
    const d = await g.get();
    assert.equal(d.status, 502);
    assert.match(d.body, /ECONNREFUSED/);
  } finally {
    await close(f.srv);
    await close(g.srv);
    await new Promise<void>((r) => raw.close(() => r()));
  }
});

test("proxy: a pooled connection is not held to the connect bound; the reply's headers are (late: the door's 502)", async () => {
  const up = createServer((req, res) => {
    const wait = Number(new URL(req.url ?? "/", "http://x").searchParams.get("wait") ?? 0);
    setTimeout(() => res.end("late but fine"), wait);
  });
  up.keepAliveTimeout = 10_000;
  const f = await front(await listen(up), { connectTimeoutMs: 100 });
  const h = await front((up.address() as AddressInfo).port, { headersTimeoutMs: 100 });
  try {
    assert.equal((await f.get()).status, 200);
    // The same kept-alive connection again, the answer slower than the connect bound.
    const slow = await f.get({}, "/?wait=300");
    assert.deepEqual([slow.status, slow.body], [200, "late but fine"]);
    const late = await h.get({}, "/?wait=400");
    assert.equal(late.status, 502);
    assert.match(late.body, /sent no reply headers in time/);
  } finally {
    await close(f.srv);
    await close(h.srv);
    await close(up);
  }
});

test("proxy: an upstream silent past Node's 5 s keep-alive timeout is waited for, on a new and a pooled connection", async () => {
  // (Seen on a cluster: every relayed exec of `sleep 8` was cut at 5 s by Node's global agent.)
  const up = createServer((_req, res) => void setTimeout(() => res.end("slow and fine"), 5_500));
  up.keepAliveTimeout = 20_000;
  const f = await front(await listen(up));
  try {
    const [a, b] = [await f.get(), await f.get()];
    assert.deepEqual([a.status, a.body, b.status, b.body], [200, "slow and fine", 200, "slow and fine"]);
  } finally {
    await close(f.srv);
    await close(up);
  }
});

test("proxy: an upgrade's refusal comes back with its body; one not answered in time is the door's 504", async () => {
  const silent = new Set<Socket>();
  const raw = createNetServer((sock) => {
    sock.on("error", () => undefined);
    sock.once("data", (d: Buffer) => {
      if (d.toString().startsWith("GET /refuse")) {
        const body = "x".repeat(100_000);
        sock.end(
          `HTTP/1.1 403 Forbidden\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`,
        );
      } else silent.add(sock);
    });
  });
  const rport = await listen(raw);
  const statuses: number[] = [];
  const srv = createServer();
  srv.on("upgrade", (req: IncomingMessage, sock: Socket, head: Buffer) =>
    proxyUpgrade(
      req,
      sock,
      head,
      { host: "127.0.0.1", port: rport },
      { name: "upstream", refusal, handshakeTimeoutMs: 200, done: (s) => statuses.push(s) },
    ),
  );
  const fport = await listen(srv);
  const upgrade = (path: string) =>
    new Promise<string>((resolve) => {
      const sock = connect(fport, "127.0.0.1", () =>
        sock.write(`GET ${path} HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n`),
      );
      let got = "";
      sock.on("data", (d: Buffer) => (got += d.toString("latin1")));
      sock.on("error", () => undefined);
      sock.on("close", () => resolve(got));
    });
  try {
    const refused = await upgrade("/refuse");
    assert.match(refused, /^HTTP\/1\.1 403 /);
    assert.equal(refused.length - refused.indexOf("\r\n\r\n") - 4, 100_000, "the whole body");
    const late = await upgrade("/silent");
    assert.match(late, /^HTTP\/1\.1 504 /);
    assert.match(late, /upstream did not answer the upgrade in time/);
    await new Promise((r) => setTimeout(r, 50));
    assert.deepEqual(statuses, [403, 504]);
  } finally {
    for (const s of silent) s.destroy();
    await close(srv);
    await new Promise<void>((r) => raw.close(() => r()));
  }
});
