/** envd's bounded event queue (streams' pacing, keepalives) and its polling watchers' bounds. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { EventQueue } from "../../src/e2b/envd/event-queue.js";
import {
  MAX_BUFFERED,
  MAX_BUFFERED_BYTES,
  MAX_PER_SANDBOX,
  MAX_PER_TENANT,
  MAX_TENANT_BYTES,
  MAX_TOTAL_BYTES,
  MAX_WATCHERS,
  Watchers,
  eventBytes,
} from "../../src/e2b/envd/watchers.js";
import { FilesystemEventSchema } from "../../src/e2b/envd/gen/filesystem/filesystem_pb.js";
import { endEvent } from "../../src/e2b/envd/process-events.js";
import { ForkdError } from "../../src/util/errors.js";

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
    for (let i = 0; i < MAX_PER_SANDBOX; i++) ids.push(w.reserve("sb-a", "alice", () => released++));
    assert.throws(
      () => w.reserve("sb-a", "alice", () => undefined),
      /too many watchers: at most 64 per sandbox/,
    );
    const other = w.reserve("sb-b", "alice", () => released++);
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
    const one = w.reserve("sb-a", "alice", () => undefined);
    for (let i = 0; i < 1000; i++) one.push(big(i));
    assert.throws(() => w.take("sb-a", one.id), /events .* were lost/);
    const kept = w.take("sb-a", one.id);
    const bytes = kept.reduce((n, e) => n + eventBytes(e), 0);
    assert.ok(bytes <= MAX_BUFFERED_BYTES, `${bytes} bytes kept`);
    assert.ok(bytes > MAX_BUFFERED_BYTES - 2 * eventBytes(big(0)), "filled up to the bound");
    assert.equal(kept.at(-1)?.name.split("-")[0], "999", "the newest are kept");
    assert.deepEqual(w.take("sb-a", one.id), [], "nothing more was lost");

    // Many full watchers of several tenants: the total stays bounded.
    const all = [];
    for (let i = 0; i < 48; i++) {
      const x = w.reserve(`sb-${i % 6}`, `t${i % 6}`, () => undefined);
      all.push({ sb: `sb-${i % 6}`, x });
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

test("watchers: each tenant has its own budget (count and bytes) under the daemon's; one exhausting its own stops nobody else", () => {
  const w = new Watchers(60_000);
  try {
    // Tenant A takes every watcher it can, over as many sandboxes as it likes.
    const a: { sb: string; x: ReturnType<Watchers["reserve"]> }[] = [];
    let refusal: unknown = null;
    for (let sb = 0; sb < MAX_WATCHERS / MAX_PER_SANDBOX && refusal === null; sb++)
      for (let i = 0; i < MAX_PER_SANDBOX; i++) {
        try {
          a.push({ sb: `sb-a${sb}`, x: w.reserve(`sb-a${sb}`, "alice", () => undefined) });
        } catch (e) {
          refusal = e;
          break;
        }
      }
    assert.equal(a.length, MAX_PER_TENANT, "A got its budget, not the daemon's");
    assert.ok(refusal instanceof ForkdError);
    assert.equal(refusal.code, "resource_exhausted");
    assert.match(refusal.message, /this tenant's sandboxes have 128, at most 128/);
    assert.equal(refusal.details.budget, "tenant");
    // B (and an admin's sandboxes) are not affected.
    const b = w.reserve("sb-b", "bob", () => undefined);
    w.reserve("sb-admin", null, () => undefined);
    // Bytes: A's watchers, all full (past the daemon's byte bound if it had no budget of its
    // own), do not make B's events drop.
    const big = (i: number) => create(FilesystemEventSchema, { name: `${i}-`.padEnd(8000, "x") });
    for (const { x } of a) for (let i = 0; i < 300; i++) x.push(big(i));
    for (let i = 0; i < 100; i++) b.push(big(i));
    assert.equal(w.take("sb-b", b.id).length, 100, "none of B's events lost");
    let kept = 0;
    for (const { sb, x } of a) {
      try {
        w.take(sb, x.id);
      } catch {
        // the loss, said; the rest follows
      }
      kept += w.take(sb, x.id).reduce((n, e) => n + eventBytes(e), 0);
    }
    assert.ok(kept <= MAX_TENANT_BYTES, `${kept} bytes kept for one tenant`);
  } finally {
    w.close();
  }
});

test("watchers: the daemon's cap holds over all tenants, with a clear error; a removal frees the tenant's budget", () => {
  const w = new Watchers(60_000, { perTenant: 3, total: 5 });
  try {
    const a = [0, 1, 2].map(() => w.reserve("sb-a", "alice", () => undefined));
    assert.throws(
      () => w.reserve("sb-a2", "alice", () => undefined),
      /this tenant's sandboxes have 3, at most 3/,
    );
    w.reserve("sb-b", "bob", () => undefined);
    w.reserve("sb-b", "bob", () => undefined);
    assert.throws(() => w.reserve("sb-c", "carol", () => undefined), /too many watchers on this host \(5\)/);
    w.remove("sb-a", a[0]!.id);
    w.reserve("sb-c", "carol", () => undefined);
    assert.throws(() => w.reserve("sb-a", "alice", () => undefined), /on this host/);
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
