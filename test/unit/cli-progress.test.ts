/**
 * How the CLI draws a long operation's progress: on a terminal one live line (redrawn in place,
 * cut to the terminal's width, kept as history when the phase changes), on a pipe plain lines
 * (every daemon event, the CLI's own counts throttled). A fake clock and fake outputs.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { ProgressView, bytesText } from "../../src/cli/progress.js";

function fakeOut(isTTY: boolean, columns = 200) {
  const out = { isTTY, columns, text: "", write: (s: string) => void (out.text += s) };
  return out;
}

function clock() {
  const c = { t: 1_000_000, now: () => c.t };
  return c;
}

test("bytes read as MiB done of total with a percentage", () => {
  assert.equal(bytesText(undefined, 10), "");
  assert.equal(bytesText(3 << 20, undefined), "3.0 MiB");
  assert.equal(bytesText(1 << 20, 4 << 20), "1.0 of 4.0 MiB (25%)");
  assert.equal(bytesText(5 << 20, 4 << 20), "5.0 of 4.0 MiB (100%)");
});

test("a terminal gets one live line per phase: redrawn in place, phase, layer and bytes first", () => {
  const out = fakeOut(true);
  const c = clock();
  const v = new ProgressView(out, { now: c.now, tickMs: 0 });
  v.event({ message: "image: ensuring template python", phase: "image" });
  c.t += 1500;
  v.event({ message: "STEP 3/9 packages", phase: "image" });
  c.t += 2000;
  v.event({
    message: "[1/3] snapshots/a/memory: downloaded (2.0 MiB)",
    phase: "download",
    layer: { index: 1, count: 3, path: "snapshots/a/memory" },
    done_bytes: 2 << 20,
    total_bytes: 8 << 20,
  });
  v.end();
  // Each draw clears the line and rewrites it; a phase change ends the line before.
  const frames = out.text.split("\r\x1b[2K").filter(Boolean);
  assert.deepEqual(frames, [
    "  [0.0s] image — image: ensuring template python",
    "  [1.5s] image — STEP 3/9 packages\n",
    "  [3.5s] download · layer 1/3 · 2.0 of 8.0 MiB (25%) — [1/3] snapshots/a/memory: downloaded (2.0 MiB)\n",
  ]);
});

test("a terminal line is cut to its width; the timer redraws it while nothing comes", async () => {
  const out = fakeOut(true, 30);
  const v = new ProgressView(out, { tickMs: 20 });
  v.event({ message: "warm: a long step that prints nothing for a while", phase: "warm" });
  await new Promise((r) => setTimeout(r, 110));
  v.end();
  const frames = out.text.split("\r\x1b[2K").filter(Boolean);
  assert.ok(frames.length >= 3, `redrawn by the timer: ${frames.length} frames`);
  for (const f of frames)
    assert.ok(f.replace("\n", "").length <= 29, `cut to the width: ${JSON.stringify(f)}`);
  assert.ok(frames.at(-1)?.endsWith("…\n"));
  const after = out.text.length;
  await new Promise((r) => setTimeout(r, 60));
  assert.equal(out.text.length, after, "nothing drawn after end()");
});

test("a pipe gets plain lines: every daemon event, its bytes when the total is known", () => {
  const out = fakeOut(false);
  const c = clock();
  const v = new ProgressView(out, { now: c.now, tickMs: 20 });
  v.event({ message: "boot: starting parent VM", phase: "boot" });
  c.t += 250;
  v.event({
    message: "[2/4] x: uploaded (1.0 MiB)",
    phase: "upload",
    done_bytes: 1 << 20,
    total_bytes: 2 << 20,
  });
  v.end();
  assert.equal(
    out.text,
    "  [0.0s] boot: starting parent VM\n  [0.3s] [2/4] x: uploaded (1.0 MiB) [1.0 of 2.0 MiB (50%)]\n",
  );
});

test("a pipe gets the CLI's own counts at a phase change and then every quietMs, not per chunk", () => {
  const out = fakeOut(false);
  const c = clock();
  const v = new ProgressView(out, { now: c.now, quietMs: 5_000 });
  for (let i = 1; i <= 100; i++) {
    c.t += 100; // 10 s of chunks
    v.local({ phase: "upload", message: "p.tar.zst", done_bytes: i << 20, total_bytes: 100 << 20 });
  }
  v.local({ phase: "verify", message: "the daemon checks every file" });
  v.end();
  const lines = out.text.trimEnd().split("\n");
  assert.deepEqual(lines, [
    "  [0.1s] upload · 1.0 of 100.0 MiB (1%) — p.tar.zst",
    "  [5.1s] upload · 51.0 of 100.0 MiB (51%) — p.tar.zst",
    "  [10.0s] verify — the daemon checks every file",
  ]);
});

test("a terminal that does not say its width (columns 0, as under script(1)) is taken as 80 wide", () => {
  const out = fakeOut(true, 0);
  const v = new ProgressView(out, { tickMs: 0 });
  v.event({ message: "x".repeat(100), phase: "upload" });
  v.end();
  assert.equal(out.text.replace("\r\x1b[2K", "").trimEnd().length, 79);
});
