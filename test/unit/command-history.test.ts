/**
 * A sandbox's command history (CommandTable): a command that ends leaves the running list and
 * is kept with how it ended (exit code, signal, timeout, or lost), oldest dropped past
 * HISTORY_MAX; a command that never started is in neither.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { ExecHandle, ExecResult } from "../../src/agent/exec.js";
import { CommandTable, HISTORY_MAX } from "../../src/sandbox/commands.js";

interface Fake {
  handle: ExecHandle;
  start(pid: number): void;
  end(r: ExecResult): void;
  fail(e: Error): void;
  failStart(e: Error): void;
}

function fake(): Fake {
  let start!: (v: { pid: number }) => void;
  let failStart!: (e: Error) => void;
  let end!: (r: ExecResult) => void;
  let fail!: (e: Error) => void;
  const started = new Promise<{ pid: number }>((res, rej) => ((start = res), (failStart = rej)));
  const result = new Promise<ExecResult>((res, rej) => ((end = res), (fail = rej)));
  const noop = () => undefined;
  return {
    handle: { started, result, writeStdin: noop, closeStdin: noop, signal: noop, resize: noop },
    start: (pid) => start({ pid }),
    end,
    fail,
    failStart,
  };
}

const tick = () => new Promise((r) => setImmediate(r));

test("a command that ends moves from the running list to the history, with how it ended", async () => {
  const t = new CommandTable();
  const a = fake();
  const b = fake();
  const c = fake();
  t.track(["sleep", "1"], false, a.handle);
  t.track("echo hi", true, b.handle, true);
  t.track(["never"], false, c.handle);
  a.start(10);
  b.start(11);
  c.failStart(new Error("no such file"));
  c.fail(new Error("no such file"));
  await tick();
  assert.deepEqual(
    t.list().map((x) => x.pid),
    [10, 11],
  );
  assert.deepEqual(t.history(), []);
  b.end({ exitCode: null, signal: 9, timedOut: false });
  await tick();
  a.end({ exitCode: 0, signal: null, timedOut: true });
  await tick();
  assert.deepEqual(
    t.list().map((x) => x.pid),
    [],
  );
  const h = t.history();
  assert.deepEqual(
    h.map(({ pid, cmd, exitCode, signal, timedOut, pty }) => ({ pid, cmd, exitCode, signal, timedOut, pty })),
    [
      { pid: 11, cmd: "echo hi", exitCode: null, signal: 9, timedOut: false, pty: true },
      { pid: 10, cmd: ["sleep", "1"], exitCode: 0, signal: null, timedOut: true, pty: false },
    ],
    "oldest first; the command that never started is in neither list",
  );
  for (const e of h) assert.ok(Date.parse(e.ended) >= Date.parse(e.started));
});

test("a command lost with its sandbox is kept without an exit; the history is bounded", async () => {
  const t = new CommandTable();
  const lost = fake();
  t.track(["lost"], false, lost.handle);
  lost.start(1);
  await tick();
  lost.fail(new Error("the sandbox ended"));
  await tick();
  assert.deepEqual(
    t.history().map((e) => [e.pid, e.exitCode, e.signal]),
    [[1, null, null]],
  );
  for (let i = 0; i < HISTORY_MAX + 5; i++) {
    const f = fake();
    t.track(["true"], false, f.handle);
    f.start(100 + i);
    f.end({ exitCode: 0, signal: null, timedOut: false });
  }
  await tick();
  const h = t.history();
  assert.equal(h.length, HISTORY_MAX);
  assert.equal(h[0]?.pid, 100 + 5, "the oldest went first (the lost one, then 100-104)");
  assert.equal(h.at(-1)?.pid, 100 + HISTORY_MAX + 4);
});
