/**
 * A sandbox's command registry (CommandTable): a command that ends leaves the running list and
 * is kept with how it ended (exit code, signal, timeout, or lost), oldest dropped past
 * HISTORY_MAX; a command that never started is in neither; a start past MAX_COMMANDS running or
 * starting is refused, whichever door asks; a command is found by pid or tag; input to a closed
 * stdin is refused.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { ExecHandle, ExecResult } from "../../src/agent/exec.js";
import { CommandTable, HISTORY_MAX, MAX_COMMANDS } from "../../src/sandbox/commands/table.js";

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
  t.track({ cmd: ["sleep", "1"], door: "api" }, a.handle, { stdinOpen: false });
  t.track({ cmd: "echo hi", door: "terminal" }, b.handle, { stdinOpen: true, pty: true });
  t.track({ cmd: ["never"], door: "envd" }, c.handle, { stdinOpen: false });
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
  t.track({ cmd: ["lost"], door: "api" }, lost.handle, { stdinOpen: false });
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
    t.track({ cmd: ["true"], door: "api" }, f.handle, { stdinOpen: false });
    f.start(100 + i);
    f.end({ exitCode: 0, signal: null, timedOut: false });
  }
  await tick();
  const h = t.history();
  assert.equal(h.length, HISTORY_MAX);
  assert.equal(h[0]?.pid, 100 + 5, "the oldest went first (the lost one, then 100-104)");
  assert.equal(h.at(-1)?.pid, 100 + HISTORY_MAX + 4);
});

test("past MAX_COMMANDS running or starting, admit() refuses (every door asks it); an end frees a place", async () => {
  const t = new CommandTable();
  const fakes = [...Array(MAX_COMMANDS).keys()].map((i) => {
    t.admit();
    const f = fake();
    t.track({ cmd: ["sleep", String(i)], door: i % 2 ? "api" : "envd" }, f.handle, { stdinOpen: false });
    return f;
  });
  assert.throws(
    () => t.admit(),
    (e: Error & { code?: string }) => e.code === "resource_exhausted",
    "starting ones count",
  );
  fakes.forEach((f, i) => f.start(1000 + i));
  await tick();
  assert.throws(
    () => t.admit(),
    (e: Error & { code?: string }) => e.code === "resource_exhausted",
  );
  fakes[0]?.end({ exitCode: 0, signal: null, timedOut: false });
  await tick();
  t.admit();
});

test("found by pid or tag (any door's), signalled and written to the same way", async () => {
  const t = new CommandTable();
  const signals: number[] = [];
  const written: string[] = [];
  const a = fake();
  a.handle.signal = (s) => void signals.push(s);
  a.handle.writeStdin = (d) => void written.push(Buffer.from(d).toString());
  t.track({ cmd: "cat", door: "api", env: { A: "1" }, cwd: "/tmp" }, a.handle, { stdinOpen: true });
  const b = fake();
  t.track({ cmd: ["sleep", "9"], door: "envd", tag: "web" }, b.handle, { stdinOpen: false });
  a.start(5);
  b.start(6);
  await tick();
  assert.equal(t.find({ tag: "web" }).pid, 6);
  assert.deepEqual(t.find({ pid: 5 }).env, { A: "1" });
  assert.throws(() => t.find({ tag: "nope" }), /no running command tagged "nope"/);
  t.signal(5, 15);
  t.input(t.get(5), Buffer.from("hi"), true);
  assert.deepEqual([signals, written, t.get(5).stdinOpen], [[15], ["hi"], false]);
  assert.throws(() => t.writeStdin(5, Buffer.from("more"), false), /standard input of pid 5 is closed/);
  assert.throws(() => t.writeStdin(6, Buffer.from("x"), false), /is closed/);
  b.end({ exitCode: null, signal: 9, timedOut: false });
  await tick();
  assert.deepEqual(
    t.history().map((e) => [e.pid, e.door, e.tag]),
    [[6, "envd", "web"]],
  );
});
