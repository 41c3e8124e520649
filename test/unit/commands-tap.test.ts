import assert from "node:assert/strict";
import { mock, test } from "node:test";
import { CommandTap, MAX_BEHIND, MAX_READERS, STALL_MS } from "../../src/sandbox/commands/tap.js";
import type { CommandReader } from "../../src/sandbox/commands/tap.js";

interface Seen {
  out: string[];
  ends: string[];
}

function reader(
  seen: Seen,
  wants: () => boolean,
  drained: Promise<void> = new Promise(() => undefined),
  paces = false,
): CommandReader {
  return {
    paces,
    output: (s, d) => {
      seen.out.push(`${s}:${d.toString()}`);
      return wants();
    },
    drained: () => drained,
    exit: (r) => seen.ends.push(`exit ${r.exitCode}`),
    error: (e) => seen.ends.push(`error ${String(e)}`),
    cut: () => seen.ends.push("cut"),
  };
}

test("attached readers get the output from their attach on and every one gets the exit", () => {
  const tap = new CommandTap();
  const owner: string[] = [];
  const h = tap.handlers({ onStdout: (d) => void owner.push(d.toString()) });
  h.onStdout?.(Buffer.from("before"));
  const a: Seen = { out: [], ends: [] };
  const b: Seen = { out: [], ends: [] };
  tap.attach(reader(a, () => true));
  const detachB = tap.attach(reader(b, () => true));
  h.onStdout?.(Buffer.from("one"));
  h.onStderr?.(Buffer.from("two"));
  detachB();
  h.onStdout?.(Buffer.from("three"));
  tap.end({ result: { exitCode: 3, signal: null, timedOut: false } });
  assert.deepEqual(owner, ["before", "one", "three"]);
  assert.deepEqual(a, { out: ["stdout:one", "stderr:two", "stdout:three"], ends: ["exit 3"] });
  assert.deepEqual(b, { out: ["stdout:one", "stderr:two"], ends: [] });
  assert.equal(tap.size, 0);
  const late: Seen = { out: [], ends: [] };
  tap.attach(reader(late, () => true));
  assert.equal(tap.size, 0, "a reader attached after the end is not kept");
  assert.deepEqual(late.ends, ["exit 3"], "it gets the end at once (it would wait forever otherwise)");
});

test("a reader that stops reading is cut past MAX_BEHIND, the others and the owner go on", () => {
  const tap = new CommandTap();
  const h = tap.handlers({});
  const slow: Seen = { out: [], ends: [] };
  const fast: Seen = { out: [], ends: [] };
  tap.attach(reader(slow, () => false));
  tap.attach(reader(fast, () => true));
  const chunk = Buffer.alloc(64 << 10, 120);
  const n = Math.ceil(MAX_BEHIND / chunk.length) + 2;
  for (let i = 0; i < n; i++) h.onStdout?.(chunk);
  assert.deepEqual(slow.ends, ["cut"]);
  assert.ok(slow.out.length < n);
  assert.equal(fast.out.length, n);
  assert.equal(tap.size, 1);
  tap.end({ error: new Error("gone") });
  assert.deepEqual(fast.ends, ["error Error: gone"]);
});

test("a reader that drains again is not cut", async () => {
  const tap = new CommandTap();
  const h = tap.handlers({});
  const r: Seen = { out: [], ends: [] };
  tap.attach(reader(r, () => false, Promise.resolve()));
  const chunk = Buffer.alloc(MAX_BEHIND - 1, 120);
  for (let i = 0; i < 4; i++) {
    h.onStdout?.(chunk);
    await new Promise((res) => setImmediate(res));
  }
  assert.deepEqual(r.ends, []);
  assert.equal(r.out.length, 4);
});

test("a pacing reader (envd's streams) holds the command's output until it drains; the owner too", async () => {
  const tap = new CommandTap();
  let ownerDone!: () => void;
  const h = tap.handlers({ onStdout: () => new Promise<void>((r) => (ownerDone = r)) });
  let drain!: () => void;
  const r: Seen = { out: [], ends: [] };
  tap.attach(reader(r, () => false, new Promise<void>((res) => (drain = res)), true));
  const held = h.onStdout?.(Buffer.from("x")) as Promise<unknown>;
  let settled = false;
  void held.then(() => (settled = true));
  ownerDone();
  await new Promise((res) => setImmediate(res));
  assert.equal(settled, false, "held while the pacing reader wants no more");
  drain();
  await held;
  assert.deepEqual(r, { out: ["stdout:x"], ends: [] });
  const free = tap.handlers({}).onStdout?.(Buffer.from("y"));
  assert.ok(free !== undefined, "a full pacing reader holds each piece");
});

test("a pacing reader that takes nothing for STALL_MS is cut, and the output flows again", async () => {
  mock.timers.enable({ apis: ["setTimeout"] });
  try {
    const tap = new CommandTap();
    const h = tap.handlers({});
    const r: Seen = { out: [], ends: [] };
    tap.attach(reader(r, () => false, undefined, true));
    const held = h.onStdout?.(Buffer.from("x")) as Promise<unknown>;
    await new Promise((res) => setImmediate(res));
    mock.timers.tick(STALL_MS);
    await held;
    assert.deepEqual(r.ends, ["cut"]);
    assert.equal(tap.size, 0);
    assert.equal(h.onStdout?.(Buffer.from("y")), undefined, "nobody holds it now");
  } finally {
    mock.timers.reset();
  }
});

test("at most MAX_READERS readers per command; a detached one frees its place", () => {
  const tap = new CommandTap();
  const detach = [...Array(MAX_READERS).keys()].map(() =>
    tap.attach(reader({ out: [], ends: [] }, () => true)),
  );
  assert.throws(
    () => tap.attach(reader({ out: [], ends: [] }, () => true)),
    (e: Error & { code?: string }) => e.code === "resource_exhausted",
  );
  assert.throws(
    () => tap.admit(),
    /64 readers attached/,
    "a door asks before its reply starts (REST: a 429)",
  );
  detach[0]?.();
  tap.attach(reader({ out: [], ends: [] }, () => true));
  assert.equal(tap.size, MAX_READERS);
});
