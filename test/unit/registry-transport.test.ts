/**
 * Registry transport (src/registry/transport.ts) against a peer that breaks a response off (a
 * declared length it never reaches, then a closed connection): the read fails with a clear
 * `unavailable`, never a raw fetch error (which the API answered with 500 internal).
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { pipeline } from "node:stream/promises";
import { Writable } from "node:stream";
import { bodyStream, readLimited, send } from "../../src/registry/transport.js";
import { ForkdError } from "../../src/util/errors.js";

let server: Server;
let base = "";

before(async () => {
  server = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": "100000" });
    res.write(Buffer.alloc(10, 7), () => res.socket?.destroy());
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

const opts = { method: "GET", policy: { insecure: false }, idleMs: 10_000, what: "registry test" };
const brokeOff = (e: unknown) =>
  e instanceof ForkdError &&
  e.code === "unavailable" &&
  /registry test: the response broke off/.test(e.message);

test("a body broken off while read whole is unavailable", async () => {
  const s = await send(new URL(`${base}/x`), opts);
  await assert.rejects(readLimited(s, 1 << 20), brokeOff);
});

test("a body broken off while streamed is unavailable", async () => {
  const s = await send(new URL(`${base}/y`), opts);
  const sink = new Writable({ write: (_c, _e, cb) => cb() });
  await assert.rejects(pipeline(bodyStream(s), sink), brokeOff);
});
