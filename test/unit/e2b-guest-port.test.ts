/** The sandbox plane's other ports: HTTP relayed to the guest port's host address, and upgrades. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { Socket } from "node:net";
import { connect, createServer as createNetServer } from "node:net";
import type { E2bServices as Services } from "../../src/e2b/context.js";
import type { SandboxAccess } from "../../src/e2b/plane-target.js";
import { guestPortHandler, guestPortUpgrade } from "../../src/e2b/guest-port.js";

const ID = "sb-abcdefghijklmnop";
const listen = async (srv: Server) => {
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  return (srv.address() as AddressInfo).port;
};

test("guest ports: HTTP and an upgrade relayed; E2B's headers and credentials stay behind; closed is 502", async () => {
  const guest = createServer((req, res) => {
    res.writeHead(200, { "content-type": "text/plain" });
    res.end(`${req.method} ${req.url} token=${String(req.headers["x-access-token"])}`);
  });
  guest.on("upgrade", (req, sock: Socket) => {
    sock.write("HTTP/1.1 101 Switching Protocols\r\nupgrade: echo\r\nconnection: upgrade\r\n\r\n");
    sock.write(`sandbox-id=${String(req.headers["e2b-sandbox-id"])};`);
    sock.pipe(sock);
  });
  const gport = await listen(guest);
  const ports: Record<string, string> = { "9000": `127.0.0.1:${gport}` };
  const services = {
    sandboxes: {
      get: () => ({ record: { network: { ports } } }),
      exposePort: async () => {
        throw new Error("no network");
      },
    },
  } as unknown as Services;
  const handler = guestPortHandler(services);
  const front = createServer((req, res) => {
    const port = Number(req.headers["e2b-sandbox-port"]);
    handler(req, res, { sandboxId: ID, port }, {} as SandboxAccess);
  });
  front.on("upgrade", (req, sock: Socket, head: Buffer) =>
    guestPortUpgrade(services, req, sock, head, {
      sandboxId: ID,
      port: Number(req.headers["e2b-sandbox-port"]),
    }),
  );
  const fport = await listen(front);
  try {
    const get = (port: string) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const r = request(
          {
            host: "127.0.0.1",
            port: fport,
            path: "/x?y=1",
            headers: { "e2b-sandbox-port": port, "x-access-token": "t" },
          },
          (res) => {
            let body = "";
            res.on("data", (d: Buffer) => (body += d.toString()));
            res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
          },
        );
        r.on("error", reject);
        r.end();
      });
    assert.deepEqual(await get("9000"), { status: 200, body: "GET /x?y=1 token=undefined" });
    const closed = await get("9001");
    assert.equal(closed.status, 502);
    assert.match(closed.body, /port 9001 is not open/);

    const echoed = await new Promise<string>((resolve, reject) => {
      const r = request({
        host: "127.0.0.1",
        port: fport,
        path: "/ws",
        headers: { connection: "upgrade", upgrade: "echo", "e2b-sandbox-id": ID, "e2b-sandbox-port": "9000" },
      });
      r.on("upgrade", (res, sock: Socket, early: Buffer) => {
        assert.equal(res.statusCode, 101);
        let got = early.toString();
        sock.on("data", (d: Buffer) => {
          got += d.toString();
          if (got.endsWith("ping")) {
            sock.destroy();
            resolve(got);
          }
        });
        sock.write("ping");
      });
      r.on("error", reject);
      r.end();
    });
    assert.equal(echoed, "sandbox-id=undefined;ping");
  } finally {
    front.closeAllConnections();
    guest.closeAllConnections();
    await new Promise<void>((r) => front.close(() => r()));
    await new Promise<void>((r) => guest.close(() => r()));
  }
});

/** A front for `handler` relaying to a raw TCP guest whose every connection `onConn` answers. */
async function rawGuest(onConn: (sock: Socket) => void) {
  const open = new Set<Socket>();
  const guest = createNetServer((sock) => {
    open.add(sock);
    sock.on("close", () => open.delete(sock));
    onConn(sock);
  });
  await new Promise<void>((r) => guest.listen(0, "127.0.0.1", r));
  const gport = (guest.address() as AddressInfo).port;
  const services = {
    sandboxes: { get: () => ({ record: { network: { ports: { "9000": `127.0.0.1:${gport}` } } } }) },
  } as unknown as Services;
  const handler = guestPortHandler(services);
  const front = createServer((req, res) =>
    handler(req, res, { sandboxId: ID, port: 9000 }, {} as SandboxAccess),
  );
  const fport = await listen(front);
  const get = () =>
    new Promise<{ status: number; body: string } | { error: string }>((resolve) => {
      const r = request({ host: "127.0.0.1", port: fport, path: "/" }, (res) => {
        let body = "";
        res.on("data", (d: Buffer) => (body += d.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        res.on("error", (e) => resolve({ error: e.message }));
      });
      r.on("error", (e) => resolve({ error: e.message }));
      r.end();
    });
  return {
    services,
    fport,
    get,
    close: async () => {
      front.closeAllConnections();
      await new Promise<void>((r) => front.close(() => r()));
      for (const sock of open) sock.destroy();
      await new Promise<void>((r) => guest.close(() => r()));
    },
  };
}

test("guest ports: a guest's status 000-099 is E2B's 502, not a throw in the proxy's events", async () => {
  for (const status of ["099", "000", "042"]) {
    const g = await rawGuest((sock) => {
      sock.on("error", () => undefined);
      sock.once("data", () => sock.end(`HTTP/1.1 ${status} X\r\ncontent-length: 2\r\n\r\nhi`));
    });
    try {
      const r = await g.get();
      assert.ok("status" in r, JSON.stringify(r));
      assert.equal(r.status, 502, status);
      assert.match(r.body, /port 9000 is not open \(the guest answered status/);
    } finally {
      await g.close();
    }
  }
});

test("guest ports: a header node will not send, a guest cut mid-body and a client gone are cut, never thrown", async () => {
  // obs-text in a header value: node's parser takes it, and writeHead is where a bad one throws.
  const g = await rawGuest((sock) => {
    sock.on("error", () => undefined);
    sock.once("data", () => {
      sock.write("HTTP/1.1 200 OK\r\ncontent-length: 100\r\nx-a: 1\r\n\r\nhalf");
      setTimeout(() => sock.destroy(), 50);
    });
  });
  try {
    const cut = await g.get();
    assert.ok("error" in cut || cut.body.length < 100, JSON.stringify(cut));
    // A client that hangs up while the guest is still answering.
    await new Promise<void>((resolve) => {
      const r = request({ host: "127.0.0.1", port: g.fport, path: "/" }, (res) => {
        res.once("data", () => {
          r.destroy();
          resolve();
        });
      });
      r.on("error", () => undefined);
      r.end();
    });
    // Still serving after both.
    const again = await g.get();
    assert.ok("error" in again || again.status === 200);
  } finally {
    await g.close();
  }
});

test("guest ports: an upgrade the guest never answers is a 504 in time; a refused one 502; hang-ups close quietly", async () => {
  const g = await rawGuest((sock) => sock.on("error", () => undefined));
  const front = createServer();
  const statuses: number[] = [];
  front.on("upgrade", (req, sock: Socket, head: Buffer) =>
    guestPortUpgrade(
      g.services,
      req,
      sock,
      head,
      { sandboxId: ID, port: 9000 },
      {
        handshakeTimeoutMs: 200,
        done: (s) => statuses.push(s),
      },
    ),
  );
  const fport = await listen(front);
  const upgrade = (destroyEarly = false) =>
    new Promise<string>((resolve) => {
      const sock = connect(fport, "127.0.0.1", () => {
        sock.write("GET /ws HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n");
        if (destroyEarly) setTimeout(() => sock.destroy(), 20);
      });
      let got = "";
      sock.on("data", (d: Buffer) => (got += d.toString()));
      sock.on("error", () => undefined);
      sock.on("close", () => resolve(got));
    });
  try {
    assert.match(await upgrade(), /^HTTP\/1\.1 504 /);
    assert.equal(await upgrade(true), "");
    await new Promise((r) => setTimeout(r, 50));
    assert.deepEqual(statuses, [504, 0]);
  } finally {
    front.closeAllConnections();
    await new Promise<void>((r) => front.close(() => r()));
    await g.close();
  }
});

test("guest ports: the credential that opened the sandbox never reaches the guest (HTTP and WebSocket); the guest's own Authorization does", async () => {
  // A guest that echoes the headers it got: as the body of a reply, and after an upgrade's 101.
  const guest = createServer((req, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(req.headers));
  });
  guest.on("upgrade", (req, sock: Socket) => {
    sock.end(
      `HTTP/1.1 101 Switching Protocols\r\nupgrade: echo\r\nconnection: upgrade\r\n\r\n${JSON.stringify(req.headers)}`,
    );
  });
  const gport = await listen(guest);
  const KEY = "e2b_0123456789abcdef0123456789abcdef01234567";
  const ACCESS = "ea_sandbox-access-token";
  const services = {
    sandboxes: { get: () => ({ record: { network: { ports: { "9000": `127.0.0.1:${gport}` } } } }) },
    e2b: {
      auth: {
        authenticate: (h: string | undefined) =>
          h === `Bearer ${KEY}`
            ? { name: "t", tenant: "a", tokenId: "tok1", limited: true, maxSandboxes: null }
            : null,
      },
      accessTokens: {
        issuedTo: (id: string, t: string) => (id === ID && t === ACCESS ? "token:tok1" : null),
      },
    },
  } as unknown as Services;
  const handler = guestPortHandler(services);
  const front = createServer((req, res) =>
    handler(req, res, { sandboxId: ID, port: 9000 }, {} as SandboxAccess),
  );
  front.on("upgrade", (req, sock: Socket, head: Buffer) =>
    guestPortUpgrade(services, req, sock, head, { sandboxId: ID, port: 9000 }),
  );
  const fport = await listen(front);
  const viaHttp = (headers: Record<string, string>) =>
    new Promise<Record<string, string>>((resolve, reject) => {
      const r = request({ host: "127.0.0.1", port: fport, path: "/", headers }, (res) => {
        let body = "";
        res.on("data", (d: Buffer) => (body += d.toString()));
        res.on("end", () => resolve(JSON.parse(body) as Record<string, string>));
      });
      r.on("error", reject);
      r.end();
    });
  const viaUpgrade = (headers: Record<string, string>) =>
    new Promise<Record<string, string>>((resolve, reject) => {
      const sock = connect(fport, "127.0.0.1", () => {
        const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`);
        sock.write(
          `GET /ws HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: echo\r\n${lines.join("")}\r\n`,
        );
      });
      let got = "";
      sock.on("data", (d: Buffer) => (got += d.toString()));
      sock.on("error", reject);
      sock.on("close", () => {
        const at = got.indexOf("\r\n\r\n");
        try {
          resolve(JSON.parse(got.slice(at + 4)) as Record<string, string>);
        } catch (e) {
          reject(new Error(`no echo in ${JSON.stringify(got)}: ${String(e)}`));
        }
      });
    });
  try {
    for (const [how, send] of [
      ["HTTP", viaHttp],
      ["WebSocket", viaUpgrade],
    ] as const) {
      // The tenant's API key as a bearer, the sandbox's token in both of E2B's headers, the
      // console's cookies and header: none of it reaches the guest; the app's own cookie does.
      const seen = await send({
        authorization: `Bearer ${KEY}`,
        "x-api-key": KEY,
        "x-access-token": ACCESS,
        "e2b-traffic-access-token": ACCESS,
        cookie: "forkd_console=s1; app=1; forkd_console_4242=s2",
        "x-forkd-console": "1",
        "x-forkd-console-key": "k",
        "x-app": "kept",
      });
      for (const h of [
        "authorization",
        "x-api-key",
        "x-access-token",
        "e2b-traffic-access-token",
        "x-forkd-console",
        "x-forkd-console-key",
      ])
        assert.equal(seen[h], undefined, `${how}: ${h} reached the guest`);
      assert.equal(seen.cookie, "app=1", how);
      assert.equal(seen["x-app"], "kept", how);
      assert.ok(!JSON.stringify(seen).includes(KEY) && !JSON.stringify(seen).includes(ACCESS), how);
      // The access token as a bearer is ours too.
      assert.equal((await send({ authorization: `Bearer ${ACCESS}` })).authorization, undefined, how);
      // The guest's own schemes and tokens pass.
      assert.equal(
        (await send({ authorization: "Basic dXNlcjpwdw==" })).authorization,
        "Basic dXNlcjpwdw==",
        how,
      );
      assert.equal(
        (await send({ authorization: "Bearer app-own-token" })).authorization,
        "Bearer app-own-token",
        how,
      );
      assert.equal((await send({ cookie: "forkd_console=s1" })).cookie, undefined, how);
    }
  } finally {
    front.closeAllConnections();
    guest.closeAllConnections();
    await new Promise<void>((r) => front.close(() => r()));
    await new Promise<void>((r) => guest.close(() => r()));
  }
});
