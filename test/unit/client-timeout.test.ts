import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { ApiError, apiRequest, checkResponse, rawRequest, readNdjson } from "../helpers/http.js";
import { execIdleMs } from "../../src/cli/timeouts.js";

let server: Server;
let url: string;

before(async () => {
  server = createServer((req, res) => {
    if (req.url === "/silent") return; // never answers
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    let n = 0;
    // /flowing: a line every 50 ms for 600 ms; /stalls: two lines, then nothing.
    const t = setInterval(() => {
      if (req.url === "/stalls" && n >= 2) return;
      res.write(JSON.stringify({ n: n++ }) + "\n");
      if (n >= 12) {
        clearInterval(t);
        res.end();
      }
    }, 50);
    res.on("close", () => clearInterval(t));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

test("a call the daemon never answers times out", async () => {
  await assert.rejects(
    apiRequest({ url }, "GET", "/silent", undefined, 200),
    (e: unknown) => e instanceof ApiError && e.code === "timeout",
  );
});

test("a stream's timeout is an idle one: one that keeps flowing outlives it, a stalled one fails", async () => {
  const lines: unknown[] = [];
  const res = await checkResponse(await rawRequest({ url }, "GET", "/flowing", undefined, 200));
  await readNdjson(res, (ev) => lines.push(ev));
  assert.equal(lines.length, 12, "600 ms of lines through a 200 ms idle timeout");
  const got: unknown[] = [];
  const stalled = await checkResponse(await rawRequest({ url }, "GET", "/stalls", undefined, 200));
  await assert.rejects(readNdjson(stalled, (ev) => got.push(ev)));
  assert.equal(got.length, 2);
});

test("exec's idle timeout follows the command's", () => {
  assert.equal(execIdleMs(5_000), 65_000);
  assert.equal(execIdleMs(undefined), 3_600_000);
});
