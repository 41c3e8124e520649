/**
 * PTY execs and directory watches against the real guest agent binary run on the host
 * (test/helpers/agent.ts): what E2B's `pty` and `watch_dir` (and the web console) stand on.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { chmod, mkdir, readFile, readdir, rename, rm, unlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { ExecHandle, ExecRequest, ExecResult, WatchEvent, WatchHandle } from "../../src/agent/client.js";
import { ForkdError } from "../../src/util/errors.js";
import { startHostAgent } from "../helpers/agent.js";
import type { HostAgent } from "../helpers/agent.js";

let h: HostAgent;
before(async () => {
  h = await startHostAgent();
});
after(async () => {
  await h.close();
});

/** A PTY exec whose output is collected as text; `until` waits for some of it. */
function pty(req: Omit<ExecRequest, "pty">, size = { rows: 24, cols: 80 }) {
  let out = "";
  const waiters: { re: RegExp; resolve: () => void }[] = [];
  const handle: ExecHandle = h.agent.exec(
    { ...req, pty: size, timeoutMs: req.timeoutMs ?? 20_000 },
    {
      onStdout: (d) => {
        out += d.toString("utf8");
        for (const w of waiters.splice(0)) {
          if (w.re.test(out)) w.resolve();
          else waiters.push(w);
        }
      },
      onStderr: () => assert.fail("a PTY command has no separate stderr"),
    },
  );
  return {
    handle,
    text: () => out,
    until: (re: RegExp, ms = 10_000) =>
      new Promise<void>((resolve, reject) => {
        if (re.test(out)) return resolve();
        const t = setTimeout(() => reject(new Error(`no ${re} in output: ${JSON.stringify(out)}`)), ms);
        waiters.push({
          re,
          resolve: () => {
            clearTimeout(t);
            resolve();
          },
        });
      }),
  };
}

test("a PTY command sees a terminal of the requested size, TERM=xterm-256color, one output stream", async () => {
  const p = pty({ shell: "tty; stty size; echo term=$TERM; echo err >&2; exit 3" }, { rows: 33, cols: 101 });
  const r = await p.handle.result;
  assert.equal(r.exitCode, 3);
  assert.match(p.text(), /^\/dev\/pts\/\d+\r\n33 101\r\nterm=xterm-256color\r\nerr\r\n$/);
  const own = pty({ shell: "echo term=$TERM", env: { TERM: "dumb" } });
  await own.handle.result;
  assert.match(own.text(), /term=dumb/);
});

test("resize changes the size a running PTY command sees (and it gets SIGWINCH)", async () => {
  const p = pty({
    argv: ["bash", "-c", "trap 'echo winch' WINCH; stty size; read x; stty size"],
  });
  await p.until(/24 80\r\n/);
  p.handle.resize(50, 132);
  // bash runs the trap once `read` returns
  await new Promise((r) => setTimeout(r, 200));
  p.handle.writeStdin(Buffer.from("\n"));
  const r = await p.handle.result;
  assert.equal(r.exitCode, 0);
  assert.match(p.text(), /24 80\r\n[\s\S]*winch[\s\S]*50 132\r\n$/);
  assert.throws(
    () => p.handle.resize(0, 10),
    (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument",
  );
});

test("input echoes; Ctrl-C interrupts the foreground command; close-stdin is ^D", async () => {
  const cat = pty({ argv: ["cat"] });
  await cat.handle.started;
  cat.handle.writeStdin(Buffer.from("hello\n"));
  await cat.until(/hello\r\nhello\r\n/); // the terminal's echo, then cat's copy
  cat.handle.closeStdin();
  assert.deepEqual(await cat.handle.result, { exitCode: 0, signal: null, timedOut: false });

  const sleep = pty({ argv: ["sleep", "100"] });
  await sleep.handle.started;
  sleep.handle.writeStdin(Buffer.from("\x03"));
  const r: ExecResult = await sleep.handle.result;
  assert.equal(r.signal, 2);
  assert.equal(r.timedOut, false);
});

test("a shell that exits with output still buffered in the terminal: all of it arrives before EXIT", async () => {
  const p = pty({ shell: "head -c 300000 /dev/zero | tr '\\0' a; exit 0" });
  const r = await p.handle.result;
  assert.equal(r.exitCode, 0);
  assert.equal(p.text().length, 300000);
});

test("a PTY command's timeout kills its group like any exec's", async () => {
  const p = pty({ shell: "sleep 100 & sleep 100", timeoutMs: 500 });
  const r = await p.handle.result;
  assert.equal(r.timedOut, true);
  assert.equal(r.signal, 9);
});

/** Host processes whose command line holds `mark` (the host agent's commands run on the host). */
async function running(mark: string): Promise<number[]> {
  const found: number[] = [];
  for (const pid of await readdir("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    const cmd = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (cmd.includes(mark)) found.push(Number(pid));
  }
  return found;
}

test("a timeout kills a job-control shell's jobs too: background and foreground, each in its own group", async () => {
  const mark = `1000.${process.pid}${Date.now() % 100000}`;
  const p = pty({ argv: ["bash", "--norc", "-i"], timeoutMs: 4_000 });
  p.handle.writeStdin(Buffer.from(`sleep ${mark}1 &\nsleep ${mark}2\n`));
  await p.until(/\[1\] \d+/);
  const deadline = Date.now() + 3_000;
  while ((await running(mark)).length < 2 && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 50));
  assert.equal((await running(mark)).length, 2, "both jobs run");
  const r = await p.handle.result;
  assert.equal(r.timedOut, true);
  let left = await running(mark);
  for (let i = 0; i < 40 && left.length > 0; i++) {
    await new Promise((res) => setTimeout(res, 50));
    left = await running(mark);
  }
  for (const pid of left) process.kill(pid, "SIGKILL");
  assert.deepEqual(left, [], "nothing of the session survives");
});

/** A watch whose events are collected; `until` waits for an event matching `pred`. */
function watch(path: string, recursive = false) {
  const events: WatchEvent[] = [];
  const waiters: { pred: (e: WatchEvent) => boolean; resolve: () => void }[] = [];
  const handle: WatchHandle = h.agent.watch(path, { recursive }, (e) => {
    events.push(e);
    for (const w of waiters.splice(0)) {
      if (w.pred(e)) w.resolve();
      else waiters.push(w);
    }
  });
  return {
    handle,
    events,
    until: (pred: (e: WatchEvent) => boolean, ms = 10_000) =>
      new Promise<void>((resolve, reject) => {
        if (events.some(pred)) return resolve();
        const t = setTimeout(() => reject(new Error(`event not seen; got ${JSON.stringify(events)}`)), ms);
        waiters.push({
          pred,
          resolve: () => {
            clearTimeout(t);
            resolve();
          },
        });
      }),
  };
}

const is = (type: string, path: string) => (e: WatchEvent) => e.type === type && e.path === path;

test("watch: create, write, chmod, rename, remove of a file, in order, with absolute paths", async () => {
  const dir = join(h.dir, "w1");
  await mkdir(dir);
  const w = watch(dir);
  await w.handle.ready;
  const a = join(dir, "a.txt");
  const b = join(dir, "b.txt");
  await writeFile(a, "hello");
  await chmod(a, 0o600);
  await rename(a, b);
  await unlink(b);
  await w.until(is("remove", b));
  const seq = w.events.map((e) => `${e.type} ${e.path}`);
  assert.deepEqual(seq, [
    `create ${a}`,
    `write ${a}`,
    `chmod ${a}`,
    `rename ${a}`,
    `create ${b}`,
    `remove ${b}`,
  ]);
  assert.ok(w.events.every((e) => e.isDir === false));
  w.handle.stop();
  await w.handle.done;
});

test("watch: recursive follows directories made later (and what is made in them at once)", async () => {
  const dir = join(h.dir, "w2");
  await mkdir(join(dir, "old"), { recursive: true });
  const w = watch(dir, true);
  const flat = watch(dir, false);
  await Promise.all([w.handle.ready, flat.handle.ready]);
  await writeFile(join(dir, "old", "f"), "x");
  await w.until(is("create", join(dir, "old", "f")));
  await mkdir(join(dir, "new"));
  await w.until((e) => e.type === "create" && e.path === join(dir, "new") && e.isDir === true);
  await writeFile(join(dir, "new", "g"), "y");
  await w.until(is("write", join(dir, "new", "g")));
  await mkdir(join(dir, "p", "q", "r"), { recursive: true });
  await writeFile(join(dir, "p", "q", "r", "deep"), "z");
  await w.until(is("create", join(dir, "p", "q", "r", "deep")));
  await flat.until(is("create", join(dir, "p")));
  // Not recursive: nothing from inside subdirectories.
  assert.ok(flat.events.every((e) => e.path.split("/").length === dir.split("/").length + 1));
  w.handle.stop();
  flat.handle.stop();
});

test("watch: the watched directory removed ends the stream cleanly", async () => {
  const dir = join(h.dir, "w3");
  await mkdir(dir);
  const w = watch(dir, true);
  await w.handle.ready;
  await writeFile(join(dir, "f"), "1");
  await rm(dir, { recursive: true });
  await w.handle.done;
  assert.ok(w.events.some(is("remove", join(dir, "f"))));
});

test("watch: a missing path is ENOENT, a file is ENOTDIR, a relative path EINVAL, before any event", async () => {
  const errno = (e: unknown) => (e instanceof ForkdError ? e.details.errno : e);
  const missing = h.agent.watch(join(h.dir, "nope"), {}, () => assert.fail("no event"));
  await assert.rejects(missing.ready, (e) => errno(e) === 2 && (e as ForkdError).code === "not_found");
  await assert.rejects(missing.done);
  await writeFile(join(h.dir, "file"), "");
  const file = h.agent.watch(join(h.dir, "file"), {}, () => assert.fail("no event"));
  await assert.rejects(file.ready, (e) => errno(e) === 20);
  const rel = h.agent.watch("relative/dir", {}, () => assert.fail("no event"));
  await assert.rejects(rel.ready, (e) => errno(e) === 22);
});

test("watch: bounded: a consumer that holds its events gets them, then one overflow; watches per agent capped", async () => {
  const dir = join(h.dir, "w4");
  await mkdir(dir);
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const events: WatchEvent[] = [];
  const w = h.agent.watch(dir, {}, (e) => {
    events.push(e);
    return held;
  });
  await w.ready;
  const n = 30_000;
  for (let i = 0; i < n; i += 500) {
    await Promise.all(Array.from({ length: 500 }, (_, j) => writeFile(join(dir, `f${i + j}`), "")));
  }
  await new Promise((r) => setTimeout(r, 500));
  const before = events.length;
  assert.ok(before < n, `the guest stopped at the window (${before} events held)`);
  release();
  const deadline = Date.now() + 10_000;
  while (!events.some((e) => e.type === "overflow") && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
  }
  const over = events.filter((e) => e.type === "overflow");
  assert.equal(over.length, 1);
  assert.equal(over[0]!.path, dir);
  assert.ok(events.length < n + 1, "events past the queue were dropped");
  w.stop();
  await w.done;

  const many: WatchHandle[] = [];
  let refused: unknown;
  for (let i = 0; i < 100 && refused === undefined; i++) {
    const x = h.agent.watch(dir, {}, () => undefined);
    many.push(x);
    await x.ready.catch((e: unknown) => (refused = e));
  }
  assert.ok(refused instanceof ForkdError && refused.details.errno === 28, String(refused));
  assert.ok(many.length > 8 && many.length < 100);
  for (const x of many) x.stop();
  // The agent is fine after all of it.
  assert.equal((await h.agent.ping()).version, 1);
});

test("watch: the window's credit is the raw bytes the guest counted, also for names that are not UTF-8", async () => {
  const dir = join(h.dir, "w-raw");
  await mkdir(dir);
  let release = (): void => undefined;
  let held = Promise.resolve();
  const hold = (): void => {
    held = new Promise<void>((r) => (release = r));
  };
  let count = 0;
  const w = h.agent.watch(dir, {}, () => {
    count++;
    return held;
  });
  await w.ready;
  // 255 bytes of 0xff: each decodes to 255 U+FFFD (765 bytes) but costs the guest 255.
  const name = (i: number) =>
    Buffer.concat([Buffer.from(`${dir}/${String(i).padStart(6, "0")}`), Buffer.alloc(249, 0xff)]);
  const make = async (from: number, n: number) => {
    for (let i = from; i < from + n; i += 500) {
      await Promise.all(
        Array.from({ length: Math.min(500, from + n - i) }, (_, j) => writeFile(name(i + j), "")),
      );
    }
  };
  const settle = async () => {
    let last = -1;
    while (count !== last) {
      last = count;
      await new Promise((r) => setTimeout(r, 400));
    }
    return count;
  };
  hold();
  await make(0, 12_500);
  const first = await settle();
  assert.ok(first < 12_500, `the guest stopped at the window (${first} events held)`);
  release();
  await new Promise((r) => setTimeout(r, 300));
  count = 0;
  hold();
  await make(12_500, 25_000);
  const second = await settle();
  // Credit given back for what was consumed is what the guest spent: the window is as before
  // (the events still queued from the first round arrive too), never about 2.4 times it.
  assert.ok(second < first * 1.4, `second window ${second} events, first ${first}`);
  release();
  w.stop();
  await w.done;
});
