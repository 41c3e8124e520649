/**
 * The code interpreter's handler (src/e2b/interpreter/handler.ts) and clients that hang up at any
 * byte: while sending the request, before the first line, mid-line, between lines. The server goes
 * on, the cell is given up (its interrupt signal fires), the sandbox's lease is released, and the
 * next request is answered in full. The kernel is a fake that streams output until interrupted.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { Server } from "node:http";
import { connect } from "node:net";
import type { AddressInfo } from "node:net";
import type { EvalOptions, EvalResult } from "../../src/agent/eval.js";
import { LOCAL } from "../../src/access/caller.js";
import type { E2bServices as Services } from "../../src/e2b/context.js";
import { interpreterHandler } from "../../src/e2b/interpreter/handler.js";
import type { ReadonlySandbox } from "../../src/sandbox/sandbox.js";

interface Cell {
  aborted: boolean;
  settled: boolean;
}

const cells: Cell[] = [];
let leases = 0;
let server: Server;
let port: number;

/** A kernel that prints a line every 5 ms until interrupted, or 40 lines. */
function fakeEval(_code: string, _t: number, _l: string, o: EvalOptions): Promise<EvalResult> {
  const cell: Cell = { aborted: false, settled: false };
  cells.push(cell);
  return new Promise((resolve, reject) => {
    let n = 0;
    const tick = setInterval(() => {
      if (cell.aborted) {
        clearInterval(tick);
        cell.settled = true;
        reject(Object.assign(new Error("interrupted"), { code: "timeout" }));
        return;
      }
      o.onOutput?.("stdout", `line ${n} ${"x".repeat(50)}\n`);
      if (++n === 40) {
        clearInterval(tick);
        cell.settled = true;
        resolve({
          ok: true,
          value: "7",
          value_data: null,
          display: [],
          stdout: "",
          stderr: "",
          error: null,
          context: "default",
          execution_count: cells.length,
        });
      }
    }, 5);
    o.signal?.addEventListener("abort", () => (cell.aborted = true), { once: true });
  });
}

before(async () => {
  const sandbox = { record: { id: "sb-test" } } as unknown as ReadonlySandbox;
  const s = {
    sandboxes: {
      lease: () => {
        leases++;
        let released = false;
        return {
          agent: { eval: fakeEval },
          explain: (e: unknown) => Promise.resolve(e),
          release: () => {
            if (!released) leases--;
            released = true;
          },
        };
      },
    },
  } as unknown as Services;
  const handle = interpreterHandler(s);
  server = createServer((req, res) =>
    handle(req, res, { sandboxId: "sb-test", port: 49999 }, { sandbox, caller: LOCAL }),
  );
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  port = (server.address() as AddressInfo).port;
});

after(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

const BODY = JSON.stringify({ code: "loop()" });
const REQUEST =
  `POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(BODY)}\r\n` +
  `connection: close\r\n\r\n${BODY}`;

/** Sends `sendBytes` of the request, reads until `readBytes` of the reply have come, hangs up. */
function cut(sendBytes: number, readBytes: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const sock = connect(port, "127.0.0.1");
    let got = 0;
    sock.on("error", reject);
    sock.on("connect", () => {
      sock.write(REQUEST.slice(0, sendBytes));
      if (sendBytes < REQUEST.length) {
        setTimeout(() => {
          sock.destroy();
          resolve(0);
        }, 20);
      }
    });
    sock.on("data", (d: Buffer) => {
      got += d.length;
      if (got >= readBytes) {
        sock.destroy();
        resolve(got);
      }
    });
    sock.on("end", () => resolve(got));
  });
}

async function settle(): Promise<void> {
  for (let i = 0; i < 200 && (leases > 0 || cells.some((c) => !c.settled)); i++) {
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function fullRun(): Promise<string[]> {
  const res = await fetch(`http://127.0.0.1:${port}/execute`, { method: "POST", body: BODY });
  assert.equal(res.status, 200);
  return (await res.text())
    .trim()
    .split("\n")
    .map((l) => (JSON.parse(l) as { type: string }).type);
}

test("a full run streams every line, then the result and the end", async () => {
  const types = await fullRun();
  assert.equal(types.filter((t) => t === "stdout").length, 40);
  assert.deepEqual(types.slice(40), ["result", "number_of_executions", "end_of_execution"]);
  await settle();
  assert.equal(leases, 0);
});

test("a client hanging up at any byte: the cell is given up, the lease released, the server goes on", async () => {
  const sendCuts = [1, 20, REQUEST.length - BODY.length, REQUEST.length - 3];
  for (const n of sendCuts) {
    await cut(n, Infinity);
    await settle();
    assert.equal(leases, 0, `cut after sending ${n} bytes: the lease is released`);
  }
  // mid-stream: after the status line, inside the headers, inside a line, after several lines
  for (const readBytes of [1, 30, 200, 333, 1000, 1777]) {
    const before = cells.length;
    await cut(REQUEST.length, readBytes);
    await settle();
    assert.equal(leases, 0, `cut after ${readBytes} bytes: the lease is released`);
    const cell = cells[before];
    assert.ok(cell, `cut after ${readBytes} bytes: the cell ran`);
    assert.equal(cell.aborted, true, `cut after ${readBytes} bytes: the cell was given up`);
  }
  const types = await fullRun();
  assert.equal(types.at(-1), "end_of_execution");
});

test("errors before the stream are plain HTTP errors", async () => {
  const post = (path: string, body: string) =>
    fetch(`http://127.0.0.1:${port}${path}`, { method: "POST", body }).then(
      async (r) => [r.status, await r.text()] as const,
    );
  let [status, text] = await post("/execute", "{not json");
  assert.equal(status, 400);
  assert.match(text, /not JSON/);
  [status, text] = await post("/execute", JSON.stringify({ code: "1", language: "r" }));
  assert.equal(status, 400);
  assert.match(text, /python, js\/javascript, bash/);
  [status] = await post("/execute", JSON.stringify({ code: "1", context_id: "python-../../x" }));
  assert.equal(status, 404);
  [status] = await post("/nope", "");
  assert.equal(status, 404);
  const health = await fetch(`http://127.0.0.1:${port}/health`);
  assert.equal(health.status, 200);
  await settle();
  assert.equal(leases, 0);
});
