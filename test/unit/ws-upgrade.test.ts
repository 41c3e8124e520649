/**
 * The daemon's WebSocket upgrade hook: only a terminal's path runs a route; any other upgrade
 * (an endless event stream, a large download) is refused before its route runs, and a refused
 * terminal upgrade sends at most 64 KiB of the reply's body, the rest never read.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { connect } from "node:net";
import { Hono } from "hono";
import type { ApiEnv } from "../../src/api/env.js";
import { TERMINAL_UPGRADE } from "../../src/api/terminal-upgrade.js";
import { wsUpgradeHandler } from "../../src/http/ws-upgrade.js";

async function raw(port: number, path: string): Promise<string> {
  const sock = connect(port, "127.0.0.1");
  sock.write(
    `GET ${path} HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n` +
      "sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
  );
  const chunks: Buffer[] = [];
  sock.on("data", (d: Buffer) => chunks.push(d));
  await new Promise((r) => sock.on("close", r));
  return Buffer.concat(chunks).toString("latin1");
}

test("only a terminal's path runs a route; a refusal's body is read 64 KiB at most", async () => {
  let streamed = 0;
  let pulled = 0;
  const app = new Hono<ApiEnv>();
  app.get("/v1/events", (c) => {
    streamed++;
    return c.body(new ReadableStream({ pull: (ctl) => ctl.enqueue(new Uint8Array(1024)) }));
  });
  app.get("/v1/sandboxes/:id/terminal", (c) => {
    const big = new ReadableStream<Uint8Array>({
      pull: (ctl) => {
        pulled++;
        ctl.enqueue(new Uint8Array(16 << 10).fill(65));
      },
    });
    return c.body(big, 404, { "content-type": "text/plain" });
  });
  const errors: unknown[] = [];
  const server = createServer((_req, res) => res.end());
  server.on(
    "upgrade",
    wsUpgradeHandler(app, TERMINAL_UPGRADE, (e) => errors.push(e)),
  );
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  try {
    const events = await raw(port, "/v1/events");
    assert.match(events, /^HTTP\/1\.1 400 /);
    assert.match(events, /only GET \/v1\/sandboxes\/\{id\}\/terminal/);
    assert.equal(streamed, 0, "the event route never ran");
    const bad = await raw(port, "//[");
    assert.match(bad, /^HTTP\/1\.1 400 /);
    const term = await raw(port, "/v1/sandboxes/sb-x/terminal");
    assert.match(term, /^HTTP\/1\.1 404 /);
    const body = term.slice(term.indexOf("\r\n\r\n") + 4);
    assert.equal(body.length, 64 << 10, "64 KiB of the refusal's body, not its endless rest");
    assert.ok(pulled < 16, `the body was read only so far (${pulled} chunks)`);
    assert.deepEqual(errors, []);
  } finally {
    server.close();
  }
});
