/**
 * A streamed reply the daemon cuts mid-way is a ConnectionError to the SDK's caller (not a bare
 * "aborted"), a line it cut in half is not silently dropped, and a character split across two
 * chunks arrives whole.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { ApiClient, ConnectionError } from "@forkd/sdk";

async function withServer(
  reply: (res: ServerResponse) => void,
  fn: (api: ApiClient) => Promise<void>,
): Promise<void> {
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => reply(res));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  try {
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    await fn(new ApiClient({ url, token: "t".repeat(40) }));
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
}

const ID = "sb-aaaaaaaaaaaaaaaa";
const started = JSON.stringify({ type: "started", pid: 7 }) + "\n";

test("a stream the daemon cuts after its first line rejects with ConnectionError, after that line", async () => {
  const got: unknown[] = [];
  await withServer(
    (res) => {
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      res.write(started, () => setTimeout(() => res.destroy(), 50));
    },
    async (api) => {
      await assert.rejects(
        api.execStream(ID, { cmd: "true" }, (ev) => got.push(ev), { timeoutMs: 5_000 }),
        (e: unknown) => e instanceof ConnectionError && /mid-reply/.test(e.message),
      );
    },
  );
  assert.deepEqual(got, [{ type: "started", pid: 7 }]);
});

test("a reply that ends inside a line is an error, not a dropped event", async () => {
  await withServer(
    (res) => {
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      res.end(started + '{"type":"exit","exit_co');
    },
    (api) =>
      assert.rejects(
        api.execStream(ID, { cmd: "true" }, () => undefined),
        ConnectionError,
      ),
  );
});

test("a multi-byte character split across two chunks is decoded whole", async () => {
  const line = Buffer.from(JSON.stringify({ type: "stdout", data: "a…b" }) + "\n");
  const cut = line.indexOf(Buffer.from("…")) + 1; // inside the character's three bytes
  const got: unknown[] = [];
  await withServer(
    (res) => {
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      res.write(line.subarray(0, cut), () => setTimeout(() => res.end(line.subarray(cut)), 50));
    },
    (api) => api.execStream(ID, { cmd: "true" }, (ev) => got.push(ev), { timeoutMs: 5_000 }),
  );
  assert.deepEqual(got, [{ type: "stdout", data: "a…b" }]);
});
