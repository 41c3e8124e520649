/**
 * What runCode / run_code send for a cell's language, in both SDKs: `language` only when it is
 * not Python (so Python cells still work against a daemon whose Eval schema has no such field),
 * and an unknown language refused before any request.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import { InvalidArgumentError, Sandbox } from "@forkd/sdk";
import { REPO_DIR } from "../../src/host/paths.js";

const RESULT = { ok: true, value: "2", value_data: null, display: [], stdout: "", stderr: "", error: null };

/** A stand-in daemon: a running sandbox sb-x whose eval route records the bodies it gets. */
async function fakeDaemon(): Promise<{ url: string; bodies: unknown[]; close(): Promise<void> }> {
  const bodies: unknown[] = [];
  const server = createServer((req, res) => {
    let raw = "";
    req.on("data", (c: Buffer) => (raw += c.toString()));
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/json" });
      if (req.method === "GET" && req.url === "/v1/sandboxes/sb-x") {
        res.end(JSON.stringify({ id: "sb-x", state: "running", exit_reason: null }));
      } else if (req.method === "POST" && req.url === "/v1/sandboxes/sb-x/eval") {
        bodies.push(JSON.parse(raw));
        res.end(JSON.stringify(RESULT));
      } else {
        res
          .writeHead(404)
          .end(JSON.stringify({ error: { code: "not_found", message: req.url, details: {} } }));
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    bodies,
    close: () => new Promise((r) => server.close(() => r())),
  };
}

test("TypeScript SDK: runCode sends language only for javascript", async () => {
  const d = await fakeDaemon();
  try {
    const sb = await Sandbox.connect("sb-x", { url: d.url, token: "t".repeat(40) });
    assert.equal((await sb.runCode("1 + 1", { timeoutMs: 5_000 })).text, "2");
    await sb.runCode("1 + 1", { language: "python", timeoutMs: 5_000 });
    await sb.runCode("1 + 1", { language: "javascript", timeoutMs: 5_000 });
    await assert.rejects(sb.runCode("1", { language: "ruby" as never }), InvalidArgumentError);
    assert.deepEqual(d.bodies, [
      { code: "1 + 1", timeout_ms: 5_000 },
      { code: "1 + 1", timeout_ms: 5_000 },
      { code: "1 + 1", timeout_ms: 5_000, language: "javascript" },
    ]);
  } finally {
    await d.close();
  }
});

test("Python SDK: run_code sends language only for javascript", async () => {
  const d = await fakeDaemon();
  try {
    const py = `
import sys
sys.path.insert(0, sys.argv[1])
import forkd
sb = forkd.Sandbox.connect("sb-x", url=sys.argv[2], token="t" * 40)
assert sb.run_code("1 + 1", timeout=5).text == "2"
sb.run_code("1 + 1", language="python", timeout=5)
sb.run_code("1 + 1", language="javascript", timeout=5)
try:
    sb.run_code("1", language="ruby")
    raise SystemExit("ruby was accepted")
except forkd.InvalidArgumentError:
    pass
`;
    await promisify(execFile)("python3", ["-c", py, join(REPO_DIR, "sdk/python/src"), d.url]);
    assert.deepEqual(d.bodies, [
      { code: "1 + 1", timeout_ms: 5_000 },
      { code: "1 + 1", timeout_ms: 5_000 },
      { code: "1 + 1", timeout_ms: 5_000, language: "javascript" },
    ]);
  } finally {
    await d.close();
  }
});
