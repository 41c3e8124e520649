/** The sandbox plane's other ports: HTTP relayed to the guest port's host address, and upgrades. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { Socket } from "node:net";
import type { Services } from "../../src/api/services.js";
import type { SandboxAccess } from "../../src/e2b/auth.js";
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
