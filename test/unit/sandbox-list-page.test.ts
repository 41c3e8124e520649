/**
 * GET /v1/sandboxes' filters and pages (listPage) and the metrics' /proc parsing: a page never
 * repeats or skips a sandbox, also when sandboxes come and go between pages.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { listPage } from "../../src/api/views/sandbox-page.js";
import { parseProcStat } from "../../src/metrics/sandbox-usage.js";
import type { ReadonlySandbox } from "../../src/sandbox/sandbox.js";

const ID = (i: number) => `sb-${"a".repeat(15)}${"abcdefghijklmnopqrstuvwxyz234567"[i] ?? "a"}`;

function sb(
  i: number,
  state: "running" | "paused" | "exited",
  metadata: Record<string, string> = {},
): ReadonlySandbox {
  return {
    state,
    record: { id: ID(i), created: `2026-12-01T00:00:${String(i).padStart(2, "0")}.000Z`, metadata },
  } as unknown as ReadonlySandbox;
}

test("state and metadata (E2B's k=v&k2=v2) filter; no limit lists everything", () => {
  const all = [sb(0, "running", { a: "1", b: "x y" }), sb(1, "paused", { a: "1" }), sb(2, "exited")];
  const ids = (q: Parameters<typeof listPage>[1]) => listPage(all, q).items.map((s) => s.record.id);
  assert.deepEqual(ids({}), [ID(0), ID(1), ID(2)]);
  assert.deepEqual(ids({ state: "running,paused" }), [ID(0), ID(1)]);
  assert.deepEqual(ids({ metadata: new URLSearchParams({ a: "1", b: "x y" }).toString() }), [ID(0)]);
  assert.deepEqual(ids({ metadata: "a=1", state: "paused" }), [ID(1)]);
  assert.equal(listPage(all, {}).nextToken, null);
});

test("pages follow each other without repeats or gaps, also when sandboxes come and go", () => {
  let all = [3, 0, 4, 1, 2].map((i) => sb(i, "running"));
  const p1 = listPage(all, { limit: 2 });
  assert.deepEqual(
    p1.items.map((s) => s.record.id),
    [ID(0), ID(1)],
  );
  assert.ok(p1.nextToken);
  all = all.filter((s) => s.record.id !== ID(1)); // gone between the pages
  all.push(sb(5, "running")); // and a new one, created after
  const p2 = listPage(all, { limit: 2, next_token: p1.nextToken ?? "" });
  assert.deepEqual(
    p2.items.map((s) => s.record.id),
    [ID(2), ID(3)],
  );
  const p3 = listPage(all, { limit: 2, next_token: p2.nextToken ?? "" });
  assert.deepEqual(
    p3.items.map((s) => s.record.id),
    [ID(4), ID(5)],
  );
  assert.equal(p3.nextToken, null);
  assert.throws(() => listPage(all, { next_token: "bm9wZQ" }), /next_token/);
});

test("/proc/<pid>/stat: busy time and start time, also with a command name holding spaces and parens", () => {
  const fields = Array.from({ length: 50 }, (_, i) => String(i));
  fields[11] = "250"; // utime (field 14)
  fields[12] = "50"; // stime (field 15)
  fields[19] = "1000"; // starttime (field 22)
  const text = `1234 (qemu (x) y) S ${fields.slice(1).join(" ")}`;
  assert.deepEqual(parseProcStat(text), { busyS: 3, startS: 10 });
  assert.equal(parseProcStat("garbage"), null);
});
