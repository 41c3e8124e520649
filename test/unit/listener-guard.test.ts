/**
 * Slowloris against every listener (src/util/listener-guard.ts): the daemon's TCP listener, its
 * unix socket, E2B's listener, `forkd console`'s server and an exposed-port relay each get
 * hundreds of connections from 127.0.0.1 that never finish their headers (or, on the relay, send
 * nothing), and legitimate requests from another address (127.0.0.2) are all served while they
 * hang; every slow connection is refused at once or cut by the header timeout (none is left
 * open). On the unix socket (one "address") the slow ones are cut and requests are served.
 * Outcomes are asserted, never times: the timeouts are short so the test ends soon.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import { connect, createServer as createNetServer } from "node:net";
import type { AddressInfo, Socket } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Hono } from "hono";
import { listenTcp, unixServer } from "../../src/daemon/main.js";
import { listenE2b } from "../../src/e2b/server.js";
import { createConsoleServer, stopConsoleServer } from "../../src/console/server.js";
import { ConsoleSessions } from "../../src/access/console-sessions.js";
import { PortRelay } from "../../src/net/expose.js";
import type { ListenerLimits } from "../../src/util/listener-guard.js";
import { addressKey } from "../../src/util/listener-guard.js";

const LIMITS: ListenerLimits = {
  maxConnections: 128,
  perAddress: 16,
  headersTimeoutMs: 400,
  keepAliveTimeoutMs: 400,
};
const SLOW = 300;
const LEGIT = 12;

/** `n` connections from `from` that send a request line and then one header line at a time, slowly. */
function slowloris(target: { port: number } | { path: string }, n: number, from = "127.0.0.1") {
  const closed: Promise<void>[] = [];
  const sockets: Socket[] = [];
  for (let i = 0; i < n; i++) {
    const s =
      "path" in target
        ? connect(target.path)
        : connect({ host: "127.0.0.1", port: target.port, localAddress: from });
    sockets.push(s);
    s.on("error", () => undefined);
    s.on("data", () => undefined);
    let timer: NodeJS.Timeout | undefined;
    s.on("connect", () => {
      s.write("GET / HTTP/1.1\r\nHost: x\r\n");
      timer = setInterval(() => s.writable && s.write("X-Slow: 1\r\n"), 100);
    });
    closed.push(new Promise((r) => s.on("close", () => (clearInterval(timer), r()))));
  }
  return { all: () => Promise.all(closed), destroy: () => sockets.forEach((s) => s.destroy()) };
}

/** One legitimate GET from `from`: its status, or the error that kept it from an answer. */
function legit(target: { port: number } | { path: string }, path: string, from = "127.0.0.2") {
  return new Promise<number | string>((resolve) => {
    const r = request(
      "path" in target
        ? { socketPath: target.path, path, agent: false }
        : { host: "127.0.0.1", port: target.port, path, localAddress: from, agent: false },
      (res) => {
        res.resume();
        res.on("end", () => resolve(res.statusCode ?? 0));
      },
    );
    r.on("error", (e) => resolve(e.message));
    r.end();
  });
}

/** The slow ones held; then LEGIT requests from another address, all of which must be served. */
async function underSlowloris(target: { port: number } | { path: string }, path: string, oneAddress = false) {
  const slow = slowloris(target, oneAddress ? LIMITS.maxConnections / 2 : SLOW);
  try {
    // Let them connect (and be refused or held) before the legitimate ones come.
    await new Promise((r) => setTimeout(r, 150));
    const statuses = await Promise.all(Array.from({ length: LEGIT }, () => legit(target, path)));
    assert.deepEqual(
      statuses.filter((s) => typeof s !== "number" || s >= 500),
      [],
      "every legitimate request answered",
    );
    // Every slow connection is refused or cut by the header timeout: none is left open.
    await slow.all();
  } finally {
    slow.destroy();
  }
}

const app = new Hono().get("*", (c) => c.text("ok"));

test("the daemon's TCP listener serves another address under slowloris, and cuts the slow ones", async () => {
  const server = await listenTcp(
    { host: "127.0.0.1", port: 0, loopback: true, tls: null, maxConnections: LIMITS.maxConnections },
    app,
    LIMITS,
  );
  try {
    await underSlowloris({ port: (server.address() as AddressInfo).port }, "/");
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

test("E2B's listener serves another address under slowloris, and cuts the slow ones", async () => {
  const server = await listenE2b(
    { host: "127.0.0.1", port: 0, tls: null, maxConnections: LIMITS.maxConnections },
    (_req, res) => res.end("ok"),
    undefined,
    LIMITS,
  );
  try {
    await underSlowloris({ port: (server.address() as AddressInfo).port }, "/");
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

test("forkd console's server serves another address under slowloris, and cuts the slow ones", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-guard-"));
  const server = createConsoleServer({
    socket: join(dir, "none.sock"),
    dist: join(dir, "no-dist"),
    sessions: new ConsoleSessions(),
    origin: () => "",
    limits: LIMITS,
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  try {
    // The page is not built here: 503 is its answer (served, not shut out).
    const status = await legit({ port: (server.address() as AddressInfo).port }, "/console/");
    assert.equal(status, 503);
    const slow = slowloris({ port: (server.address() as AddressInfo).port }, SLOW);
    await new Promise((r) => setTimeout(r, 150));
    const statuses = await Promise.all(
      Array.from({ length: LEGIT }, () =>
        legit({ port: (server.address() as AddressInfo).port }, "/console/"),
      ),
    );
    assert.deepEqual(statuses, Array<number>(LEGIT).fill(503));
    await slow.all();
  } finally {
    await stopConsoleServer(server);
    await rm(dir, { recursive: true, force: true });
  }
});

test("the unix socket cuts connections that never finish their headers and serves the rest", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-guard-"));
  const path = join(dir, "d.sock");
  const server = unixServer(app, LIMITS);
  await new Promise<void>((r) => server.listen(path, r));
  try {
    await underSlowloris({ path }, "/", true);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    await rm(dir, { recursive: true, force: true });
  }
});

test("an exposed port's relay keeps room for other addresses when one holds hundreds of connections", async () => {
  const echo = createNetServer((s) => s.pipe(s));
  await new Promise<void>((r) => echo.listen(0, "127.0.0.1", r));
  const relay = await PortRelay.listen("127.0.0.1", 0, {
    host: "127.0.0.1",
    port: (echo.address() as AddressInfo).port,
  });
  const idle: Socket[] = [];
  try {
    // Connections that send nothing, ever (a relay carries any protocol: no header timeout).
    const closedEarly: Promise<boolean>[] = [];
    for (let i = 0; i < SLOW; i++) {
      const s = connect({ host: "127.0.0.1", port: relay.hostPort, localAddress: "127.0.0.1" });
      s.on("error", () => undefined);
      idle.push(s);
      closedEarly.push(new Promise((r) => s.on("close", () => r(true))));
    }
    await new Promise((r) => setTimeout(r, 150));
    const talk = () =>
      new Promise<string>((resolve) => {
        const s = connect({ host: "127.0.0.1", port: relay.hostPort, localAddress: "127.0.0.2" }, () =>
          s.write("ping"),
        );
        s.on("data", (d: Buffer) => {
          resolve(d.toString());
          s.destroy();
        });
        s.on("error", (e) => resolve(e.message));
        s.on("close", () => resolve("closed"));
      });
    assert.deepEqual(
      await Promise.all(Array.from({ length: LEGIT }, talk)),
      Array<string>(LEGIT).fill("ping"),
    );
    // The one address got no more than its share: the rest of its connections were refused.
    const refused = (
      await Promise.all(
        closedEarly.map((p) => Promise.race([p, new Promise<boolean>((r) => setImmediate(() => r(false)))])),
      )
    ).filter(Boolean).length;
    assert.ok(refused >= SLOW - 64, `${refused} of ${SLOW} refused`);
  } finally {
    idle.forEach((s) => s.destroy());
    await relay.close();
    await new Promise((r) => echo.close(r));
  }
});

test("addresses are counted per IPv4 address and per IPv6 /64", () => {
  assert.equal(addressKey("10.0.0.1"), "10.0.0.1");
  assert.equal(addressKey("::ffff:10.0.0.1"), "10.0.0.1");
  assert.equal(addressKey("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
  assert.equal(addressKey("2001:db8:1:2::9"), "2001:db8:1:2::/64");
  assert.equal(addressKey("2001:db8::1"), "2001:db8:0:0::/64");
  assert.equal(addressKey(undefined), "local");
});
