/**
 * Streamed progress to a slow reader (no daemon): while the reply is over its high-water mark
 * progress lines are dropped and counted, one line says how many once the reader catches up, and
 * the final event is still written; against a fake sink and against a real reply body.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { pacedProgress } from "../../src/api/paced-progress.js";
import { replyStream } from "../../src/http/reply-stream.js";
import type { ReplySink } from "../../src/http/reply-stream.js";

test("pacedProgress: lines over the high-water mark are dropped and counted", async () => {
  const sent: unknown[] = [];
  let room = 2;
  let release: () => void = () => undefined;
  const sink: Pick<ReplySink, "line" | "drained" | "done"> = {
    done: false,
    line(v) {
      sent.push(v);
      return --room > 0;
    },
    drained: () => new Promise<void>((r) => (release = r)),
  };
  const progress = pacedProgress(sink);
  for (let i = 0; i < 10_000; i++) progress(`line ${i}`, { phase: "run" });
  // Two queued (the second said "wait"), the other 9998 dropped, not queued.
  assert.deepEqual(sent, [
    { type: "progress", message: "line 0", phase: "run" },
    { type: "progress", message: "line 1", phase: "run" },
  ]);
  room = 100;
  release();
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(sent[2], {
    type: "progress",
    message: "9998 progress lines dropped (the client reads slower than they come)",
  });
  progress("after", {});
  assert.deepEqual(sent[3], { type: "progress", message: "after" });
  assert.equal(sent.length, 4);
});

test("a real reply body: a reader that does not read makes memory stay bounded, the end arrives", async () => {
  let sink!: ReplySink;
  const body = replyStream((s) => (sink = s), { highWaterMark: 4096 });
  const progress = pacedProgress(sink);
  const n = 20_000;
  for (let i = 0; i < n; i++) progress(`#1 ${"x".repeat(100)} ${i}`, { phase: "run" });
  sink.line({ type: "done", ok: true });
  sink.end();
  const text = await new Response(body).text();
  const lines = text
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as { type: string; message?: string });
  // Only about the high-water mark was queued while nobody read: not 20,000 lines (~2.3 MB).
  assert.ok(text.length < 4096 + 1000, String(text.length));
  assert.deepEqual(lines[lines.length - 1], { type: "done", ok: true });
  const shown = lines.filter((l) => l.message?.startsWith("#1 ")).length;
  assert.ok(shown > 0 && shown < n, String(shown));
});
