/** The live registry: lookups, the order of the list, children being forked counted by tag. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { SandboxRegistry } from "../../src/sandbox/registry.js";
import { markExited, markPaused, newSandbox } from "../../src/sandbox/sandbox.js";
import type { Sandbox } from "../../src/sandbox/sandbox.js";
import { ForkdError } from "../../src/util/errors.js";

const sandbox = (n: number, tag: string): Sandbox => ({
  ...newSandbox(
    {
      format: 1,
      id: `sb-${"a".repeat(15)}${"bcdefghijk"[n] ?? "z"}`,
      tag,
      pid: 100 + n,
      pidStartTime: 1,
      // Created in the reverse order of n.
      created: new Date(Date.UTC(2026, 0, 1, 0, 0, 10 - n)).toISOString(),
      timings: { launchMs: 0, restoreMs: 0, readyMs: 0, totalMs: 0 },
      fromPool: false,
    },
    "/nonexistent",
    null,
    null,
    null,
  ),
  lastUsed: 0,
});

const code = (c: string) => (e: unknown) => e instanceof ForkdError && e.code === c;

test("get: a malformed id is invalid, an unknown one not found; find does not throw", () => {
  const r = new SandboxRegistry();
  const a = sandbox(1, "t");
  r.add(a);
  assert.equal(r.get(a.record.id), a);
  assert.throws(() => r.get("nope"), code("invalid_argument"));
  assert.throws(() => r.get(sandbox(2, "t").record.id), code("not_found"));
  assert.equal(r.find(sandbox(2, "t").record.id), null);
  r.delete(a.record.id);
  assert.throws(() => r.get(a.record.id), code("not_found"));
});

test("list: oldest first", () => {
  const r = new SandboxRegistry();
  for (const n of [1, 3, 2]) r.add(sandbox(n, "t"));
  assert.deepEqual(
    r.list().map((s) => s.record.pid),
    [103, 102, 101],
  );
});

test("running: a paused or exited sandbox is a conflict saying why", () => {
  const r = new SandboxRegistry();
  const p = sandbox(1, "t");
  markPaused(p);
  const x = sandbox(2, "t");
  markExited(x, "idle timeout");
  r.add(p);
  r.add(x);
  assert.throws(
    () => r.running(p.record.id),
    (e: unknown) => code("conflict")(e) && /paused; resume it first/.test(String(e)),
  );
  assert.throws(
    () => r.running(x.record.id),
    (e: unknown) => code("conflict")(e) && /idle timeout/.test(String(e)),
  );
  // Marked exited once: a second mark changes nothing.
  assert.equal(markExited(x, "killed"), false);
  assert.equal(x.exitReason, "idle timeout");
});

test("children being forked count against the limit and their tag until released (once)", () => {
  const r = new SandboxRegistry();
  r.add(sandbox(1, "a"));
  const exited = sandbox(2, "a");
  markExited(exited, "killed");
  r.add(exited);
  assert.equal(r.held, 2);
  assert.equal(r.countByTag("a"), 1); // an exited sandbox holds nothing of its snapshot
  const doneA = r.starting("a", 3);
  const doneB = r.starting("b", 2);
  assert.equal(r.held, 7);
  assert.equal(r.countByTag("a"), 4);
  assert.equal(r.countByTag("b"), 2);
  doneA();
  doneA();
  assert.equal(r.held, 4);
  assert.equal(r.countByTag("a"), 1);
  doneB();
  assert.equal(r.countByTag("b"), 0);
  assert.equal(r.held, 2);
});
