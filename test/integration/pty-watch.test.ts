/**
 * PTYs and directory watches through forkd's REST API in a real VM (what E2B's `pty` and
 * `watch_dir`, and the web console, stand on): a PTY command sees a terminal of its size, a
 * resize changes it, input echoes, Ctrl-C interrupts, exit codes come back; a watch reports
 * create/write/chmod/rename/remove in order, follows new subdirectories when recursive, says
 * 404 for a missing path, ends when its directory goes, is cancelled in the guest when its
 * client hangs up, and the guest bounds how many there are.
 *
 * One daemon, one snapshot of the python template and one sandbox for the whole file.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { Lines } from "../helpers/lines.js";
import { ApiError, checkResponse, rawRequest } from "../helpers/http.js";
import { api, forkOne } from "../helpers/vm.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { steps } from "../helpers/steps.js";

const { step, failed } = steps();
let d: TestDaemon;
let id: string;

before(async () => {
  d = await makeDaemon({ FORKD_POOL_SIZE: "0" });
  await api(d, "POST", "/v1/snapshots", { tag: "ptyw", memory_mib: 256 });
  id = await forkOne(d, "ptyw");
});

after(async () => {
  await d?.destroy(failed());
});

async function execStream(body: unknown): Promise<Lines> {
  const res = await rawRequest(
    d.ep,
    "POST",
    `/v1/sandboxes/${id}/exec/stream`,
    JSON.stringify(body),
    120_000,
    {
      "content-type": "application/json",
    },
  );
  await checkResponse(res);
  const l = new Lines(res);
  await l.until((x) => x.line("started") !== undefined, "started");
  return l;
}

const pidOf = (l: Lines) => l.line("started")!.pid as number;

async function stdin(pid: number, data: string): Promise<void> {
  const res = await rawRequest(d.ep, "POST", `/v1/sandboxes/${id}/commands/${pid}/stdin`, data, 60_000);
  await checkResponse(res);
  res.resume();
}

async function watch(path: string, recursive = false): Promise<Lines> {
  const q = `path=${encodeURIComponent(path)}${recursive ? "&recursive=1" : ""}`;
  const res = await rawRequest(d.ep, "GET", `/v1/sandboxes/${id}/files/watch?${q}`, undefined, 0);
  await checkResponse(res);
  const l = new Lines(res);
  await l.until((x) => x.line("ready") !== undefined, "ready");
  return l;
}

const sh = (cmd: string) =>
  api<{ exit_code: number; stdout: string }>(d, "POST", `/v1/sandboxes/${id}/exec`, { cmd });

step("a PTY command sees a terminal of its size and TERM; its exit code comes back", async () => {
  const r = await api<{ exit_code: number; stdout: string; stderr: string }>(
    d,
    "POST",
    `/v1/sandboxes/${id}/exec`,
    { cmd: "tty; stty size; echo $TERM; echo to-stderr >&2; exit 7", pty: { rows: 30, cols: 90 } },
  );
  assert.equal(r.exit_code, 7);
  assert.match(r.stdout, /^\/dev\/pts\/\d+\r\n30 90\r\nxterm-256color\r\nto-stderr\r\n$/);
  assert.equal(r.stderr, "");
  const plain = await sh("tty; true");
  assert.match(plain.stdout, /not a tty/);
  // As another user: the terminal is that user's (programs reopen it by name).
  const as = await api<{ exit_code: number; stdout: string }>(d, "POST", `/v1/sandboxes/${id}/exec`, {
    cmd: 'id -un; test -O "$(tty)" && echo owned; echo typed > /dev/tty',
    user: "nobody",
    pty: { rows: 24, cols: 80 },
  });
  assert.equal(as.stdout, "nobody\r\nowned\r\ntyped\r\n");
});

step("resize changes what a running PTY command sees; input echoes", async () => {
  const l = await execStream({
    cmd: ["bash", "-c", "stty size; read x; stty size; read y; echo got=$y"],
    pty: { rows: 24, cols: 80 },
  });
  const pid = pidOf(l);
  await l.until((x) => x.text().includes("24 80\r\n"), "the first size");
  const cmds = await api<{ commands: { pid: number; pty: boolean; stdin_open: boolean }[] }>(
    d,
    "GET",
    `/v1/sandboxes/${id}/commands`,
  );
  assert.deepEqual(
    cmds.commands.filter((c) => c.pid === pid).map((c) => [c.pty, c.stdin_open]),
    [[true, true]],
  );
  await api(d, "POST", `/v1/sandboxes/${id}/commands/${pid}/resize`, { rows: 40, cols: 120 });
  await stdin(pid, "\n");
  await l.until((x) => x.text().includes("40 120\r\n"), "the new size");
  await stdin(pid, "hello\n");
  await l.until((x) => x.line("exit") !== undefined, "exit");
  assert.match(l.text(), /40 120\r\nhello\r\ngot=hello\r\n$/); // the echo, then the command's
  assert.equal(l.line("exit")!.exit_code, 0);
});

step("Ctrl-C interrupts a PTY command", async () => {
  const l = await execStream({ cmd: ["sleep", "300"], pty: { rows: 24, cols: 80 } });
  await stdin(pidOf(l), "\x03");
  await l.until((x) => x.line("exit") !== undefined, "exit");
  assert.equal(l.line("exit")!.signal, 2);
  assert.equal(l.line("exit")!.timed_out, false);
});

step("resize: a command without a PTY is 409, an unknown pid 404, a bad size 400", async () => {
  const l = await execStream({ cmd: ["sleep", "300"], keep_stdin_open: true });
  const pid = pidOf(l);
  const resize = (p: number, body: unknown) =>
    api(d, "POST", `/v1/sandboxes/${id}/commands/${p}/resize`, body);
  await assert.rejects(resize(pid, { rows: 10, cols: 10 }), (e) => e instanceof ApiError && e.status === 409);
  await assert.rejects(
    resize(999_999, { rows: 10, cols: 10 }),
    (e) => e instanceof ApiError && e.status === 404,
  );
  await assert.rejects(resize(pid, { rows: 0, cols: 10 }), (e) => e instanceof ApiError && e.status === 400);
  await api(d, "POST", `/v1/sandboxes/${id}/commands/${pid}/signal`, { signal: "SIGKILL" });
  await l.until((x) => x.line("exit") !== undefined, "exit");
});

step("watch: create, write, chmod, rename and remove, in order, with absolute paths", async () => {
  await sh("mkdir -p /tmp/w1");
  const w = await watch("/tmp/w1");
  await sh("echo hi > /tmp/w1/a; chmod 600 /tmp/w1/a; mv /tmp/w1/a /tmp/w1/b; rm /tmp/w1/b");
  await w.until((x) => x.lines.some((l) => l.type === "remove"), "remove");
  const seq = w.lines
    .filter((l) => l.type !== "ready")
    .map((l) => `${l.type} ${String(l.path)} ${String(l.is_dir)}`);
  assert.deepEqual(seq, [
    "create /tmp/w1/a false",
    "write /tmp/w1/a false",
    "chmod /tmp/w1/a false",
    "rename /tmp/w1/a false",
    "create /tmp/w1/b false",
    "remove /tmp/w1/b false",
  ]);
  w.res.destroy();
});

step("watch: recursive follows a directory made later; the directory removed ends the stream", async () => {
  await sh("mkdir -p /tmp/w2/old");
  const w = await watch("/tmp/w2", true);
  await sh("echo 1 > /tmp/w2/old/f; mkdir -p /tmp/w2/new/deeper && echo 2 > /tmp/w2/new/deeper/g");
  const has = (type: string, path: string) => (x: Lines) =>
    x.lines.some((l) => l.type === type && l.path === path);
  await w.until(has("create", "/tmp/w2/old/f"), "create of old/f");
  await w.until(has("create", "/tmp/w2/new"), "create of new");
  await w.until(has("create", "/tmp/w2/new/deeper/g"), "create of new/deeper/g");
  assert.equal(w.lines.find((l) => l.path === "/tmp/w2/new")!.is_dir, true);
  await sh("rm -rf /tmp/w2");
  await w.until((x) => x.line("end") !== undefined, "end");
  await w.until((x) => x.ended, "the reply's end");
});

step("watch: a missing path is 404, a file is 400, before any event", async () => {
  const get = (path: string) =>
    api(d, "GET", `/v1/sandboxes/${id}/files/watch?path=${encodeURIComponent(path)}`);
  await assert.rejects(get("/nonexistent/dir"), (e) => e instanceof ApiError && e.status === 404);
  await assert.rejects(get("/etc/hostname"), (e) => e instanceof ApiError && e.status === 400);
});

step("watch: clients hanging up cancel their watches in the guest; watches are bounded", async () => {
  await sh("mkdir -p /tmp/w3");
  const open: Lines[] = [];
  let refused: unknown;
  for (let i = 0; i < 100 && refused === undefined; i++) {
    try {
      open.push(await watch("/tmp/w3"));
    } catch (e) {
      refused = e;
    }
  }
  assert.ok(refused instanceof ApiError && refused.code === "resource_exhausted", String(refused));
  assert.ok(open.length >= 16 && open.length < 100, `${open.length} watches at once`);
  for (const w of open) w.res.destroy(); // hang up mid-stream
  // The guest forgot them: as many can be made again, and commands still run.
  const again: Lines[] = [];
  for (let i = 0; i < open.length; i++) {
    let w: Lines | undefined;
    for (let t = 0; t < 50 && !w; t++) {
      w = await watch("/tmp/w3").catch(async (e: unknown) => {
        if (!(e instanceof ApiError) || e.code !== "resource_exhausted") throw e;
        await new Promise((r) => setTimeout(r, 100)); // a cancel still on its way
        return undefined;
      });
    }
    assert.ok(w, `watch ${i} after the hang-ups`);
    again.push(w);
  }
  await sh("touch /tmp/w3/x");
  await Promise.all(again.map((w) => w.until((x) => x.lines.some((l) => l.type === "create"), "create")));
  for (const w of again) w.res.destroy();
  assert.equal((await sh("echo ok")).stdout, "ok\n");
});

step(
  "watch: clients that hang up before the reply (while the guest starts the watch) leave nothing behind",
  async () => {
    await sh("mkdir -p /tmp/w4");
    // More than the guest's limit: had any of them stayed, the last watch below would be refused.
    for (let i = 0; i < 80; i++) {
      const ac = new AbortController();
      const res = rawRequest(
        d.ep,
        "GET",
        `/v1/sandboxes/${id}/files/watch?path=/tmp/w4&recursive=1`,
        undefined,
        0,
        {},
        ac.signal,
      ).catch(() => undefined);
      await new Promise((r) => setTimeout(r, i % 4)); // at a few points before and around the reply
      ac.abort();
      await res;
    }
    let w: Lines | undefined;
    for (let t = 0; t < 50 && !w; t++) {
      w = await watch("/tmp/w4").catch(async (e: unknown) => {
        if (!(e instanceof ApiError) || e.code !== "resource_exhausted") throw e;
        await new Promise((r) => setTimeout(r, 100)); // a cancel still on its way
        return undefined;
      });
    }
    assert.ok(w, "a watch after the hang-ups");
    await sh("touch /tmp/w4/y");
    await w.until((x) => x.lines.some((l) => l.type === "create" && l.path === "/tmp/w4/y"), "create");
    w.res.destroy();
    assert.equal((await sh("echo ok")).stdout, "ok\n");
  },
);
