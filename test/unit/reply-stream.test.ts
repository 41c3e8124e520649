/**
 * A streamed reply's body survives its client: writes, ends and failures after a hang-up are
 * dropped (never thrown), the work hears of the hang-up once (also when the client left before
 * the reply started, which the HTTP server never reports to the body), the reply is paced by its
 * reader, and a Node writer into it (a pipeline) is ended when the client goes; a streamed reply
 * whose credential is revoked ends with its reason and stops its work (src/api/revocable.ts).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { request } from "node:http";
import type { Server, ServerResponse } from "node:http";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createAdaptorServer } from "@hono/node-server";
import { Hono } from "hono";
import type { HttpBindings } from "@hono/node-server";
import { replyStream } from "../../src/http/reply-stream.js";
import type { ReplySink } from "../../src/http/reply-stream.js";
import { OpenStreams } from "../../src/access/open-streams.js";
import { revocableReply } from "../../src/api/revocable.js";

const dec = new TextDecoder();
const bytes = (s: string) => new TextEncoder().encode(s);

/** A stand-in for node-server's ServerResponse: what replyStream looks at. */
function fakeOutgoing(destroyed = false): ServerResponse & { finish(): void; hangUp(): void } {
  const e = new EventEmitter() as EventEmitter & Record<string, unknown>;
  e.destroyed = destroyed;
  e.writableFinished = false;
  e.finish = () => {
    e.writableFinished = true;
    e.emit("close");
  };
  e.hangUp = () => {
    e.destroyed = true;
    e.emit("close");
  };
  return e as unknown as ServerResponse & { finish(): void; hangUp(): void };
}

function opened(opts: Parameters<typeof replyStream>[1] = {}): {
  sink: ReplySink;
  body: ReadableStream<Uint8Array>;
  hangups: () => number;
} {
  let sink!: ReplySink;
  let n = 0;
  const body = replyStream((s) => {
    sink = s;
    s.onHangup(() => n++);
  }, opts);
  return { sink, body, hangups: () => n };
}

test("after the client cancels, writes, lines, end and fail are dropped, never thrown", async () => {
  const { sink, body, hangups } = opened();
  assert.equal(sink.line({ type: "progress", message: "one" }), true);
  const reader = body.getReader();
  const first = await reader.read();
  assert.equal(dec.decode(first.value), '{"type":"progress","message":"one"}\n');
  await reader.cancel(new Error("client went away"));
  assert.equal(sink.gone, true);
  assert.equal(sink.done, true);
  assert.equal(hangups(), 1);
  assert.equal(sink.write(bytes("late")), false);
  assert.equal(sink.line({ type: "done" }), false);
  sink.end();
  sink.fail(new Error("late failure"));
  await sink.drained(); // resolves: nothing to wait for once gone
  let later = 0;
  sink.onHangup(() => later++);
  assert.equal(later, 1, "a handler added after the hang-up runs at once");
  assert.equal(hangups(), 1, "the hang-up is reported once");
});

test("ending delivers everything queued; the end is not a hang-up; a second end is a no-op", async () => {
  const { sink, body, hangups } = opened();
  sink.line({ n: 1 });
  sink.write(bytes("raw"));
  sink.end();
  sink.end();
  sink.fail(new Error("too late"));
  assert.equal(sink.write(bytes("after end")), false);
  const text = dec.decode(new Uint8Array(await new Response(body).arrayBuffer()));
  assert.equal(text, '{"n":1}\nraw');
  assert.equal(hangups(), 0);
  assert.equal(sink.gone, false);
});

test("fail cuts the reply: the reader sees the error after what was queued", async () => {
  const { sink, body } = opened();
  const reader = body.getReader();
  sink.write(bytes("part"));
  assert.equal(dec.decode((await reader.read()).value), "part");
  sink.fail(new Error("pack failed"));
  await assert.rejects(reader.read(), /pack failed/);
});

test("a connection closed before the reply was built: the work is told at once, the body is empty", async () => {
  let startedGone: boolean | null = null;
  let told = 0;
  const body = replyStream(
    (s) => {
      startedGone = s.gone;
      s.onHangup(() => told++);
      assert.equal(s.line({ type: "started" }), false);
    },
    { outgoing: fakeOutgoing(true) },
  );
  assert.equal(startedGone, true);
  assert.equal(told, 1);
  // The server still reads it (it does not know): it finds the end, not an error to report.
  assert.equal((await new Response(body).arrayBuffer()).byteLength, 0);
});

test("the connection closing before the reply finished is a hang-up; after it finished it is not", async () => {
  const early = fakeOutgoing();
  const a = opened({ outgoing: early });
  a.sink.write(bytes("queued for a reader stuck on the closed connection"));
  early.hangUp();
  await new Promise((r) => setImmediate(r));
  assert.equal(a.hangups(), 1);
  assert.equal(a.sink.gone, true);
  // The body is cut with what node-server takes for a user abort (not a failure to report).
  await assert.rejects(a.body.getReader().read(), { code: "ERR_STREAM_PREMATURE_CLOSE" });

  const late = fakeOutgoing();
  const b = opened({ outgoing: late });
  b.sink.end();
  late.finish();
  await new Promise((r) => setImmediate(r));
  assert.equal(b.hangups(), 0);
  assert.equal(b.sink.gone, false);
});

test("a hang-up handler that throws reaches neither the caller nor the process", async () => {
  let sink!: ReplySink;
  const body = replyStream((s) => {
    sink = s;
    s.onHangup(() => {
      throw new Error("agent connection closed");
    });
  });
  let second = 0;
  sink.onHangup(() => second++);
  await body.cancel();
  assert.equal(second, 1, "later handlers still run");
});

test("paced by the reader: write says when to wait, drained resolves on demand", async () => {
  const { sink, body } = opened({ highWaterMark: 8 });
  assert.equal(sink.write(bytes("1234")), true);
  assert.equal(sink.write(bytes("5678")), false, "at the high-water mark");
  let drained = false;
  const waiting = sink.drained().then(() => (drained = true));
  await new Promise((r) => setImmediate(r));
  assert.equal(drained, false, "nobody read yet");
  const reader = body.getReader();
  await reader.read();
  await waiting;
  assert.equal(drained, true);
  reader.releaseLock();
});

test("a reader that takes nothing while the producer waits is taken for gone after stallMs", async () => {
  const out = fakeOutgoing();
  let destroyed = false;
  (out as unknown as { destroy(): void }).destroy = () => (destroyed = true);
  const { sink, body, hangups } = opened({ highWaterMark: 4, stallMs: 50, outgoing: out });
  assert.equal(sink.write(bytes("1234")), false);
  // It resolves only through the stall (nobody reads); without the bound it would never.
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    sink.drained(),
    new Promise(
      (_, reject) => (timer = setTimeout(() => reject(new Error("drained() never resolved")), 5_000)),
    ),
  ]);
  clearTimeout(timer);
  assert.equal(sink.gone, true);
  assert.equal(hangups(), 1);
  assert.equal(destroyed, true, "its connection is cut");
  await assert.rejects(body.getReader().read());
});

test("a reader that keeps reading is never taken for gone, however slowly it reads", async () => {
  const { sink, body, hangups } = opened({ highWaterMark: 4, stallMs: 80 });
  const reader = body.getReader();
  for (let i = 0; i < 5; i++) {
    if (!sink.write(bytes("1234"))) {
      const waiting = sink.drained();
      await new Promise((r) => setTimeout(r, 40)); // each wait shorter than stallMs, all longer
      await reader.read();
      await waiting;
    }
  }
  assert.equal(sink.gone, false);
  assert.equal(hangups(), 0);
  reader.releaseLock();
});

test("a pipeline into writable() is paced, completes, and is ended when the client goes", async () => {
  // Complete: every byte arrives in order and the reply ends.
  const a = opened({ highWaterMark: 1024 });
  const chunks = Array.from({ length: 64 }, (_, i) => Buffer.alloc(256, i));
  const [, got] = await Promise.all([
    pipeline(Readable.from(chunks), a.sink.writable()),
    new Response(a.body).arrayBuffer(),
  ]);
  assert.deepEqual(Buffer.from(got), Buffer.concat(chunks));

  // The client goes mid-way: the pipeline fails (its source is destroyed), no more is read.
  const b = opened({ highWaterMark: 1024 });
  let produced = 0;
  const source = new Readable({
    read() {
      produced++;
      this.push(Buffer.alloc(256, 1));
    },
  });
  const piping = pipeline(source, b.sink.writable());
  const reader = b.body.getReader();
  await reader.read();
  await reader.cancel();
  await assert.rejects(piping, /client went away/);
  assert.equal(source.destroyed, true);
  const at = produced;
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(produced, at, "the source is no longer read");
});

test("a client gone before the writer attaches its pipeline: no stray error, the pipeline fails", async () => {
  const out = fakeOutgoing();
  const a = opened({ outgoing: out });
  const w = a.sink.writable(); // e.g. while the pack is still being staged
  out.hangUp();
  await new Promise((r) => setImmediate(r));
  assert.equal(w.destroyed, true);
  await assert.rejects(pipeline(Readable.from([Buffer.from("late")]), w), /client went away/);
});

/** A real server: the client hangs up while the route is still working, before any byte. */
test("over HTTP: a client gone before the reply started is reported to the work", async () => {
  let told!: () => void;
  const hungUp = new Promise<void>((r) => (told = r));
  let arrived!: () => void;
  const inRoute = new Promise<void>((r) => (arrived = r));
  let lines = 0;
  const app = new Hono<{ Bindings: HttpBindings }>();
  app.get("/s", async (c) => {
    arrived();
    await new Promise((r) => setTimeout(r, 200)); // the route's own work (e.g. a guest round trip)
    const body = replyStream(
      (s) => {
        s.onHangup(told);
        const t = setInterval(() => (s.line({ n: lines }) ? lines++ : clearInterval(t)), 5);
        s.onHangup(() => clearInterval(t));
      },
      { outgoing: c.env.outgoing },
    );
    return new Response(body, { headers: { "content-type": "application/x-ndjson" } });
  });
  const server = createAdaptorServer({ fetch: app.fetch }) as Server;
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  try {
    const port = (server.address() as { port: number }).port;
    const req = request({ host: "127.0.0.1", port, path: "/s" });
    req.on("error", () => undefined);
    req.end();
    await inRoute;
    req.destroy();
    await hungUp;
    assert.equal(lines, 0, "nothing was produced for nobody");
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

test("revocable replies: NDJSON ends with an error line (after a cut line), SSE with an error event, bytes are cut; the work hears a hang-up", async () => {
  const opened = new OpenStreams();
  const run = async (type: string, chunks: string[]) => {
    let hungUp = 0;
    let done = 0;
    let sink: ReplySink | null = null;
    const body = replyStream((s) => {
      sink = s;
      s.onHangup(() => hungUp++);
      for (const c of chunks) s.write(bytes(c));
    }).pipeThrough(
      revocableReply(
        type,
        (end) => opened.open("token:tok-aaaaaaaaaaaa", end),
        () => done++,
      ),
    );
    const reader = body.getReader();
    let text = "";
    const read = (async () => {
      for (;;) {
        const r = await reader.read();
        if (r.done) return "ended";
        text += dec.decode(r.value);
      }
    })().catch((e: unknown) => e);
    await new Promise((r) => setImmediate(r));
    assert.equal(opened.revoke("token:tok-aaaaaaaaaaaa"), 1);
    const how = await read;
    await new Promise((r) => setImmediate(r));
    assert.equal(done, 1, "its slot freed once");
    assert.equal(hungUp, 1, "the work feeding it is told, as for a hang-up");
    assert.equal((sink as ReplySink | null)?.gone, true);
    assert.equal(opened.count("token:tok-aaaaaaaaaaaa"), 0);
    return { how, text };
  };
  const nd = await run("application/x-ndjson", ['{"type":"started","pid":7}\n', '{"type":"stdout","da']);
  assert.equal(nd.how, "ended");
  const lines = nd.text.split("\n");
  assert.equal(lines.length, 4, nd.text);
  assert.equal(lines[1], '{"type":"stdout","da', "a cut line is left as it was, on its own");
  const last = JSON.parse(lines[2] ?? "") as {
    type: string;
    error: { code: string; details: { reason: string } };
  };
  assert.equal(last.type, "error");
  assert.equal(last.error.code, "unauthenticated");
  assert.equal(last.error.details.reason, "token_revoked");
  const sse = await run("text/event-stream; charset=utf-8", ["id: 1\nevent: state\ndata: {}\n\n"]);
  assert.equal(sse.how, "ended");
  assert.match(sse.text, /\n\nevent: error\ndata: \{"error":\{"code":"unauthenticated",[^\n]*\n\n$/);
  const bin = await run("application/octet-stream", ["half a file"]);
  assert.ok(bin.how instanceof Error, "a byte stream is cut, never ended as if whole");
  assert.equal(bin.text, "half a file");
});
