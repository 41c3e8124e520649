/**
 * `forkd quickstart` with more than 10 children prints no MaxListenersExceededWarning: each child's
 * calls get a signal of their own (fanOut, src/cli/interrupt.ts) and the SDK's transport adds
 * one abort listener per call and removes it when the call is over. Run against a stand-in
 * daemon on a unix socket, through the real SDK.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { createServer } from "node:http";
import type { IncomingMessage, ServerResponse } from "node:http";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ApiClient } from "@forkd/sdk";
import { fanOut } from "../../src/cli/interrupt.js";
import { quickstart } from "../../src/cli/quickstart.js";

const N = 16;
const timings = { ready_ms: 5, total_ms: 6 };

function daemon(req: IncomingMessage, res: ServerResponse): void {
  const reply = (v: unknown) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(v));
  };
  req.resume();
  req.on("end", () => {
    const url = req.url ?? "";
    if (req.method === "GET" && url.startsWith("/v1/snapshots/"))
      return reply({ tag: "q", timings: { boot_ms: 900 } });
    if (req.method === "POST" && url === "/v1/sandboxes")
      return reply({
        sandboxes: Array.from({ length: N }, (_, i) => ({
          id: `sb-${String(i).padStart(16, "a")}`,
          pid: i,
          timings,
        })),
        failures: [],
      });
    // Every child's calls are in flight together before any is answered.
    if (url.endsWith("/exec"))
      return void setTimeout(() => reply({ stdout: "hi\n", stderr: "", exit_code: 0 }), 50);
    if (url.endsWith("/eval")) return void setTimeout(() => reply({ value: "1.0" }), 50);
    if (req.method === "DELETE") return reply({ id: "x", deleted: true });
    res.writeHead(404).end();
  });
}

test(`quickstart with ${N} children: no MaxListenersExceededWarning`, async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-quickstart-"));
  const sock = join(dir, "d.sock");
  const server = createServer(daemon);
  await new Promise<void>((r) => server.listen(sock, r));
  const warnings: Error[] = [];
  const onWarning = (w: Error) => warnings.push(w);
  process.on("warning", onWarning);
  const log = console.log;
  console.log = () => undefined;
  try {
    const said: string[] = [];
    const code = await quickstart(
      new ApiClient({ socket: sock }),
      { n: N, tag: "q", keep: false },
      (s) => said.push(s),
      { isTTY: false, write: () => true },
    );
    assert.equal(code, 0, said.join("\n"));
    // A warning is emitted on the next tick.
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(
      warnings.filter((w) => w.name === "MaxListenersExceededWarning").map((w) => w.message),
      [],
    );
  } finally {
    console.log = log;
    process.off("warning", onWarning);
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    await rm(dir, { recursive: true, force: true });
  }
});

test("the SDK leaves no abort listener on a signal after its calls end, and still aborts; fanOut adds one", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-signal-"));
  const sock = join(dir, "d.sock");
  const server = createServer(daemon);
  await new Promise<void>((r) => server.listen(sock, r));
  try {
    const api = new ApiClient({ socket: sock });
    const ctl = new AbortController();
    for (let i = 0; i < 20; i++)
      await api.exec("sb-aaaaaaaaaaaaaaaa", { cmd: "true" }, { signal: ctl.signal });
    assert.equal(getEventListeners(ctl.signal, "abort").length, 0);
    // Aborted before the call, and while it waits for its reply: an AbortError either way.
    const isAbort = (e: unknown) => e instanceof Error && e.name === "AbortError";
    await assert.rejects(
      api.exec("sb-aaaaaaaaaaaaaaaa", { cmd: "true" }, { signal: AbortSignal.abort() }),
      isAbort,
    );
    const early = new AbortController();
    const waiting = api.exec("sb-aaaaaaaaaaaaaaaa", { cmd: "true" }, { signal: early.signal });
    setTimeout(() => early.abort(), 10);
    await assert.rejects(waiting, isAbort);
    assert.equal(getEventListeners(early.signal, "abort").length, 0);
    const each = fanOut(ctl.signal, 50);
    assert.equal(getEventListeners(ctl.signal, "abort").length, 1);
    ctl.abort();
    assert.ok(each.every((s) => s.aborted));
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    await rm(dir, { recursive: true, force: true });
  }
});
