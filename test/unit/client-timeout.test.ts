/**
 * The SDK's timeouts (what the CLI's src/cli/timeouts.ts values mean): an idle timeout, not a
 * deadline. A call the daemon never answers fails with TimeoutError; a stream that keeps
 * flowing outlives the timeout, a stalled one fails with TimeoutError (not a bare "aborted");
 * an aborted call rejects with an AbortError, also mid-stream.
 */
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { ApiClient, TimeoutError } from "@forkd/sdk";
import { execIdleMs } from "../../src/cli/timeouts.js";

let server: Server;
let url: string;

before(async () => {
  server = createServer((req, res) => {
    if (req.url === "/v1/health") return; // never answers
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    let n = 0;
    // .../flowing/exec/stream: an event every 50 ms for 600 ms; .../stalls/...: two, then nothing.
    const t = setInterval(() => {
      if (req.url?.includes("stalls") && n >= 2) return;
      n++;
      res.write(JSON.stringify({ type: "stdout", data: "" }) + "\n");
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
  await assert.rejects(new ApiClient({ url, token: "" }).health({ timeoutMs: 200 }), TimeoutError);
});

test("a stream's timeout is an idle one: one that keeps flowing outlives it, a stalled one fails", async () => {
  const api = new ApiClient({ url, token: "" });
  const lines: unknown[] = [];
  await api.execStream("flowing", { cmd: "x" }, (ev) => lines.push(ev), { timeoutMs: 200 });
  assert.equal(lines.length, 12, "600 ms of lines through a 200 ms idle timeout");
  const got: unknown[] = [];
  await assert.rejects(
    api.execStream("stalls", { cmd: "x" }, (ev) => got.push(ev), { timeoutMs: 200 }),
    TimeoutError,
  );
  assert.equal(got.length, 2);
});

test("aborting a stream rejects it with an AbortError", async () => {
  const api = new ApiClient({ url, token: "" });
  const ctl = new AbortController();
  const got: unknown[] = [];
  await assert.rejects(
    api.execStream(
      "stalls",
      { cmd: "x" },
      (ev) => {
        got.push(ev);
        if (got.length === 2) ctl.abort();
      },
      { timeoutMs: 0, signal: ctl.signal },
    ),
    (e: unknown) => e instanceof Error && e.name === "AbortError",
  );
});

test("exec's idle timeout follows the command's", () => {
  assert.equal(execIdleMs(5_000), 65_000);
  assert.equal(execIdleMs(undefined), 3_600_000);
});
