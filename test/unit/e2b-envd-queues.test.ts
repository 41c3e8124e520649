/** envd's bounded event queue (streams' pacing, keepalives) and its polling watchers' bounds. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { EventQueue } from "../../src/e2b/envd/event-queue.js";
import {
  MAX_BUFFERED,
  MAX_BUFFERED_BYTES,
  MAX_PER_SANDBOX,
  MAX_TOTAL_BYTES,
  Watchers,
  eventBytes,
} from "../../src/e2b/envd/watchers.js";
import { FilesystemEventSchema } from "../../src/e2b/envd/gen/filesystem/filesystem_pb.js";
import { endEvent } from "../../src/e2b/envd/process-table.js";

test("event queue: bounded by bytes, room() once read, keepalives while idle, drained then ended", async () => {
  const q = new EventQueue<string>(10);
  assert.equal(q.push("a", 6), true);
  assert.equal(q.push("b", 6), false, "over the bound");
  let roomy = false;
  const room = q.room().then(() => (roomy = true));
  await new Promise((r) => setImmediate(r));
  assert.equal(roomy, false);
  assert.deepEqual(await q.next(1000), { event: "a" });
  await room;
  assert.equal(roomy, true);
  assert.deepEqual(await q.next(1000), { event: "b" });
  assert.deepEqual(await q.next(10), { keepalive: true });
  q.push("c");
  q.close();
  assert.deepEqual(await q.next(1000), { event: "c" }, "what was queued before the close is read");
  assert.equal(await q.next(1000), null);
  const ac = new AbortController();
  const q2 = new EventQueue<string>();
  const pending = q2.next(60_000, ac.signal);
  ac.abort();
  assert.equal(await pending, null, "a reader that hangs up stops waiting");
  const q3 = new EventQueue<string>();
  q3.close(new Error("why"));
  await assert.rejects(q3.next(1000), /why/);
});

test("watchers: at most MAX_PER_SANDBOX per sandbox, events bounded, idle ones removed and released", () => {
  const w = new Watchers(1000);
  try {
    let released = 0;
    const ids = [];
    for (let i = 0; i < MAX_PER_SANDBOX; i++) ids.push(w.reserve("sb-a", () => released++));
    assert.throws(() => w.reserve("sb-a", () => undefined), /too many watchers/);
    const other = w.reserve("sb-b", () => released++);
    const first = ids[0]!;
    for (let i = 0; i < MAX_BUFFERED + 5; i++) first.push(create(FilesystemEventSchema, { name: `f${i}` }));
    assert.throws(() => w.take("sb-a", first.id), /5 events .* were lost/, "the loss is said first");
    const got = w.take("sb-a", first.id);
    assert.equal(got.length, MAX_BUFFERED);
    assert.equal(got[0]?.name, "f5", "the oldest were dropped");
    assert.throws(() => w.take("sb-b", first.id), /not found/, "another sandbox's watcher");
    w.remove("sb-b", other.id);
    assert.equal(released, 1);
    w.expire(Date.now() + 2000);
    assert.equal(released, 1 + MAX_PER_SANDBOX, "idle watchers are removed and their leases released");
    assert.throws(() => w.take("sb-a", first.id), /not found/);
  } finally {
    w.close();
  }
});

test("watchers: events bounded in bytes per watcher and over all watchers; losses are said", () => {
  const w = new Watchers(60_000);
  try {
    const big = (i: number) => create(FilesystemEventSchema, { name: `${i}-`.padEnd(8000, "x") });
    const one = w.reserve("sb-a", () => undefined);
    for (let i = 0; i < 1000; i++) one.push(big(i));
    assert.throws(() => w.take("sb-a", one.id), /events .* were lost/);
    const kept = w.take("sb-a", one.id);
    const bytes = kept.reduce((n, e) => n + eventBytes(e), 0);
    assert.ok(bytes <= MAX_BUFFERED_BYTES, `${bytes} bytes kept`);
    assert.ok(bytes > MAX_BUFFERED_BYTES - 2 * eventBytes(big(0)), "filled up to the bound");
    assert.equal(kept.at(-1)?.name.split("-")[0], "999", "the newest are kept");
    assert.deepEqual(w.take("sb-a", one.id), [], "nothing more was lost");

    // Many full watchers: the total stays bounded.
    const all = [];
    for (let i = 0; i < 48; i++) {
      const x = w.reserve(`sb-${i % 2 ? "b" : "c"}`, () => undefined);
      all.push({ sb: `sb-${i % 2 ? "b" : "c"}`, x });
      for (let j = 0; j < 300; j++) x.push(big(j));
    }
    let total = 0;
    for (const { sb, x } of all) {
      try {
        w.take(sb, x.id);
      } catch {
        // the loss, said; the rest follows
      }
      total += w.take(sb, x.id).reduce((n, e) => n + eventBytes(e), 0);
    }
    assert.ok(total <= MAX_TOTAL_BYTES, `${total} bytes over all watchers`);
    assert.ok(total > MAX_TOTAL_BYTES / 2, "most of the total was kept");
  } finally {
    w.close();
  }
});

test("end events read as Go's process states", () => {
  assert.deepEqual(endEvent({ exitCode: 0, signal: null, timedOut: false }), {
    type: "end",
    exitCode: 0,
    exited: true,
    status: "exit status 0",
  });
  assert.deepEqual(endEvent({ exitCode: null, signal: 9, timedOut: false }), {
    type: "end",
    exitCode: -1,
    exited: false,
    status: "signal: killed",
    error: "signal: killed",
  });
});
