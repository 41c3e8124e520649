/**
 * envd (port 49983) with the unmodified npm `e2b` SDK against a real daemon and VM (one daemon,
 * the E2B-style snapshot of test/helpers/e2b.ts, one sandbox for most steps): commands (streamed
 * stdout/stderr callbacks, envs, cwd, the default user vs root, exit errors as
 * CommandExitError, background handles, list, connect, stdin, kill), files (text and bytes,
 * ownership by the user, list with depth, exists, info, rename, makeDir, remove, watchDir, all
 * as the user: root's files refused to it, read as root,
 * signed upload and download URLs routed by Host), PTY (create, input, resize, kill),
 * clients that hang up mid-stream (Start, Connect, WatchDir) without the daemon or the process
 * minding, an API key revoked: the access token it was given refused, its streams ended, and
 * commands that run through a pause and resume (asked, or at the sandbox's timeout: E2B's
 * auto-pause): listed, connected to, killed; every run after them starts; and one command
 * registry under both APIs: a command started through forkd's REST exec is an envd process
 * (listed with its envs, connected to, killed) and one started through envd a REST command
 * (listed, signalled, in the history).
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:http";
import { CommandExitError, NotFoundError, Sandbox, SandboxError, FileType } from "e2b";
import type { CommandHandle } from "e2b";
import { E2B_TENANT, startE2bDaemon } from "../helpers/e2b.js";
import type { E2bDaemon } from "../helpers/e2b.js";
import { createInterface } from "node:readline";
import { apiRequest, rawRequest } from "../helpers/http.js";
import { steps } from "../helpers/steps.js";

let e: E2bDaemon;
let sbx: Sandbox;
const { step, failed } = steps();

const waitFor = async (what: string, ok: () => boolean | Promise<boolean>, ms = 60_000) => {
  const t0 = Date.now();
  while (!(await ok())) {
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
};

/** A raw HTTP request to the E2B listener (Host-routed when `host` is given). */
function raw(
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: Buffer,
): Promise<{ status: number; body: Buffer }> {
  const u = new URL(e.env.E2B_SANDBOX_URL);
  return new Promise((resolve, reject) => {
    const r = request({ host: u.hostname, port: u.port, method, path, headers }, (res) => {
      const parts: Buffer[] = [];
      res.on("data", (d: Buffer) => parts.push(d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(parts) }));
      res.on("error", reject);
    });
    r.on("error", reject);
    r.end(body);
  });
}

/** Starts a Connect server stream by hand and hangs up after its first `bytes` bytes of reply. */
function hangUpAfter(method: string, msg: unknown, bytes: number): Promise<number> {
  const u = new URL(e.env.E2B_SANDBOX_URL);
  const json = Buffer.from(JSON.stringify(msg));
  const frame = Buffer.alloc(5 + json.length);
  frame.writeUInt32BE(json.length, 1);
  json.copy(frame, 5);
  return new Promise((resolve, reject) => {
    const r = request(
      {
        host: u.hostname,
        port: u.port,
        method: "POST",
        path: `/${method}`,
        headers: {
          "content-type": "application/connect+json",
          "e2b-sandbox-id": sbx.sandboxId,
          "e2b-sandbox-port": "49983",
          "x-access-token": (sbx as unknown as { envdAccessToken: string }).envdAccessToken,
        },
      },
      (res) => {
        let got = 0;
        res.on("data", (d: Buffer) => {
          got += d.length;
          if (got >= bytes) {
            r.destroy();
            resolve(got);
          }
        });
        res.on("end", () => resolve(got));
      },
    );
    r.on("error", (err) =>
      (err as NodeJS.ErrnoException).code === "ECONNRESET" ? resolve(-1) : reject(err),
    );
    r.end(frame);
  });
}

before(async () => {
  e = await startE2bDaemon();
  Object.assign(process.env, e.env);
  sbx = await Sandbox.create(e.template, { timeoutMs: 900_000, requestTimeoutMs: 300_000 });
});

after(async () => {
  if (sbx) await sbx.kill().catch(() => undefined);
  await e?.daemon.destroy(failed());
});

step("commands.run: stdout and stderr to callbacks, envs, cwd, the user's home as default", async () => {
  const out: string[] = [];
  const err: string[] = [];
  const r = await sbx.commands.run('echo "$GREETING"; echo oops >&2; pwd; whoami', {
    envs: { GREETING: "hello" },
    onStdout: (d) => void out.push(d),
    onStderr: (d) => void err.push(d),
    timeoutMs: 120_000,
  });
  assert.equal(r.stdout, "hello\n/home/user\nuser\n");
  assert.equal(out.join(""), r.stdout);
  assert.equal(err.join(""), "oops\n");
  const root = await sbx.commands.run("whoami; pwd", { user: "root", cwd: "/tmp" });
  assert.equal(root.stdout, "root\n/tmp\n");
  const rel = await sbx.commands.run("mkdir -p sub && cd sub && pwd && cd .. && rmdir sub");
  assert.equal(rel.stdout, "/home/user/sub\n");
});

step("commands.run: a non-zero exit is a CommandExitError with its code, output and error", async () => {
  await assert.rejects(sbx.commands.run("echo partial; echo bad >&2; exit 3"), (err: unknown) => {
    assert.ok(err instanceof CommandExitError, String(err));
    assert.equal(err.exitCode, 3);
    assert.equal(err.stdout, "partial\n");
    assert.equal(err.stderr, "bad\n");
    assert.equal(err.error, "exit status 3");
    return true;
  });
});

step("background: list, sendStdin, connect from a second handle, closeStdin, kill", async () => {
  const h = await sbx.commands.run("cat", { background: true, stdin: true });
  assert.ok(h.pid > 0);
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid && p.args.includes("cat")));
  const other = await sbx.commands.connect(h.pid);
  await sbx.commands.sendStdin(h.pid, "echoed\n");
  await waitFor(
    "both handles to see the echo",
    () => h.stdout.includes("echoed") && other.stdout.includes("echoed"),
  );
  await sbx.commands.closeStdin(h.pid);
  const r = await h.wait();
  assert.equal(r.exitCode, 0, "cat ends at the end of its input");
  const s = await sbx.commands.run("sleep 600", { background: true });
  assert.equal(await sbx.commands.kill(s.pid), true);
  await assert.rejects(s.wait(), CommandExitError);
  assert.equal(await sbx.commands.kill(s.pid), false, "a process that is gone is not found");
});

step("one registry: a REST exec is an envd process, an envd process a REST command", async () => {
  const id = sbx.sandboxId;
  const rest = <T>(method: string, path: string, body?: unknown) =>
    apiRequest<T>(e.daemon.ep, method, `/v1/sandboxes/${id}${path}`, body, 60_000);
  type Cmd = { pid: number; cmd: string[] | string; signal?: number | null };
  // Started through REST (its stream open: the command runs while it is read) ...
  const res = await rawRequest(
    e.daemon.ep,
    "POST",
    `/v1/sandboxes/${id}/exec/stream`,
    JSON.stringify({ cmd: "echo up; sleep 600", env: { FROM: "rest" } }),
    120_000,
    { "content-type": "application/json" },
  );
  const lines = createInterface({ input: res })[Symbol.asyncIterator]();
  const next = async () => JSON.parse(String((await lines.next()).value)) as Record<string, unknown>;
  const started = await next();
  assert.equal(started.type, "started");
  const pid = Number(started.pid);
  // ... listed by envd's List as `/bin/sh -c LINE` with its envs, connected to, killed.
  const listed = (await sbx.commands.list()).find((p) => p.pid === pid);
  assert.ok(listed, "the REST command is an envd process");
  assert.deepEqual(
    [listed.cmd, listed.args, listed.envs],
    ["/bin/sh", ["-c", "echo up; sleep 600"], { FROM: "rest" }],
  );
  const attached = await sbx.commands.connect(pid, { timeoutMs: 0 });
  assert.equal(await sbx.commands.kill(pid), true);
  await assert.rejects(
    attached.wait(),
    (err: unknown) => err instanceof CommandExitError && /killed/.test(err.error ?? ""),
  );
  let last = await next();
  while (last.type !== "exit") last = await next();
  assert.equal(last.signal, 9, "the REST stream's exit: killed through envd");
  // Started through envd: listed by REST, signalled by REST, in REST's history.
  const h = await sbx.commands.run("sleep 600", { background: true, envs: { FROM: "envd" } });
  const running = (await rest<{ commands: Cmd[] }>("GET", "/commands")).commands.find((c) => c.pid === h.pid);
  assert.deepEqual(running?.cmd, ["/bin/bash", "-l", "-c", "sleep 600"]);
  await rest("POST", `/commands/${h.pid}/signal`, { signal: "SIGTERM" });
  await assert.rejects(
    h.wait(),
    (err: unknown) => err instanceof CommandExitError && /terminated/.test(err.error ?? ""),
  );
  const history = (await rest<{ commands: Cmd[] }>("GET", "/commands/history")).commands;
  assert.deepEqual(
    [pid, h.pid].map((p) => history.filter((c) => c.pid === p).at(-1)?.signal),
    [9, 15],
    "both in the one history",
  );
  assert.ok(!(await sbx.commands.list()).some((p) => p.pid === h.pid || p.pid === pid));
});

step(
  "files: text and bytes, the user's ownership, info, list with depth, rename, makeDir, remove",
  async () => {
    const w = await sbx.files.write("notes/a.txt", "hi there");
    assert.equal(w.path, "/home/user/notes/a.txt");
    assert.equal(await sbx.files.read("notes/a.txt"), "hi there");
    const bytes = new Uint8Array([0, 1, 2, 255, 10]);
    await sbx.files.write("/home/user/b.bin", bytes.buffer);
    assert.deepEqual(await sbx.files.read("b.bin", { format: "bytes" }), bytes);
    const info = await sbx.files.getInfo("notes/a.txt");
    assert.equal(info.type, FileType.FILE);
    assert.equal(info.size, 8);
    assert.equal(info.owner, "user");
    assert.equal(info.group, "user");
    assert.equal((await sbx.files.getInfo("notes")).owner, "user", "the parent made for the user is theirs");
    assert.match(info.permissions, /^-rw/);
    await sbx.files.write("/tmp/root.txt", "r", { user: "root" });
    assert.equal((await sbx.files.getInfo("/tmp/root.txt")).owner, "root");
    const names = (await sbx.files.list(".")).map((x) => x.name);
    assert.ok(names.includes("notes") && names.includes("b.bin"), names.join(","));
    assert.ok((await sbx.files.list(".", { depth: 2 })).some((x) => x.path === "/home/user/notes/a.txt"));
    assert.equal(await sbx.files.exists("nope.txt"), false);
    assert.equal(await sbx.files.makeDir("d/e"), true);
    assert.equal(await sbx.files.makeDir("d/e"), false);
    assert.equal((await sbx.files.rename("notes/a.txt", "d/e/a.txt")).path, "/home/user/d/e/a.txt");
    await sbx.files.remove("d");
    assert.equal(await sbx.files.exists("d/e/a.txt"), false);
    await assert.rejects(sbx.files.read("missing.txt"), NotFoundError);
    await assert.rejects(sbx.files.write("/etc/forbidden", "x"), "the user may not write as root");
  },
);

step("files are read, moved, removed and watched as the user: root's stay root's (403)", async () => {
  // E2B's SDK has no error class of its own for an envd 403: a SandboxError naming the status.
  // (403 from /files; the Connect services' permission_denied: "7: ... Operation not permitted".)
  const denied = (x: unknown) => {
    if (x instanceof SandboxError && /403|Permission denied|Operation not permitted/.test(x.message))
      return true;
    throw x;
  };
  await assert.rejects(sbx.files.read("/etc/shadow"), denied, "/etc/shadow as user");
  assert.match(await sbx.files.read("/etc/shadow", { user: "root" }), /^root:/m);
  // A signed download URL acts as its signed user; raw envd with username=user the same.
  const host = `49983-${sbx.sandboxId}.e2b.test`;
  const signedUrl = new URL(await sbx.downloadUrl("/etc/shadow", { useSignatureExpiration: 120 }));
  const got = await raw("GET", signedUrl.pathname + signedUrl.search, { host });
  assert.equal(got.status, 403, got.body.toString());
  assert.match(got.body.toString(), /"code":403/);
  const token = (sbx as unknown as { envdAccessToken: string }).envdAccessToken;
  const asUser = await raw("GET", "/files?path=%2Fetc%2Fshadow&username=user", {
    host,
    "x-access-token": token,
  });
  assert.equal(asUser.status, 403, asUser.body.toString());
  const asRoot = await raw("GET", "/files?path=%2Fetc%2Fshadow", {
    host,
    "x-access-token": token,
    authorization: "Basic cm9vdDo=",
  });
  assert.equal(asRoot.status, 200, asRoot.body.toString());
  assert.match(asRoot.body.toString(), /^root:/m);
  // The user's own file, unreadable to others, is readable to the user.
  await sbx.files.write("private.txt", "mine");
  await sbx.commands.run("chmod 600 /home/user/private.txt");
  assert.equal(await sbx.files.read("private.txt"), "mine");
  assert.equal((await sbx.files.getInfo("private.txt")).owner, "user");
  // root's files: not moved, not removed, their directory not watched, by the user.
  await sbx.files.write("/tmp/root-only.txt", "r", { user: "root" });
  await assert.rejects(sbx.files.rename("/tmp/root-only.txt", "/tmp/taken.txt"), denied, "rename");
  await assert.rejects(sbx.files.remove("/tmp/root-only.txt"), denied, "remove");
  assert.equal(await sbx.files.read("/tmp/root-only.txt", { user: "root" }), "r");
  await assert.rejects(
    sbx.files.watchDir("/root", () => undefined),
    (x: unknown) => x instanceof SandboxError,
    "watching root's home as user",
  );
  const w = await sbx.files.watchDir("/root", () => undefined, { user: "root" });
  await w.stop();
});

step("files.watchDir: a file made in the watched directory is reported", async () => {
  await sbx.files.makeDir("watched");
  const seen: string[] = [];
  const w = await sbx.files.watchDir("watched", (ev) => void seen.push(`${ev.type}:${ev.name}`));
  await sbx.files.write("watched/new.txt", "x");
  await waitFor("a watch event", () => seen.some((s) => s.endsWith(":new.txt")));
  await w.stop();
});

step("signed upload and download URLs, routed by a <port>-<id>.<domain> Host", async () => {
  const up = new URL(await sbx.uploadUrl("signed.txt", { useSignatureExpiration: 120 }));
  const host = `49983-${sbx.sandboxId}.e2b.test`;
  const put = await raw(
    "POST",
    up.pathname + up.search,
    { host, "content-type": "application/octet-stream" },
    Buffer.from("via url"),
  );
  assert.equal(put.status, 200, put.body.toString());
  const down = new URL(await sbx.downloadUrl("signed.txt"));
  const got = await raw("GET", down.pathname + down.search, { host });
  assert.equal(got.status, 200);
  assert.equal(got.body.toString(), "via url");
  const forged = await raw("GET", down.pathname + down.search.replace(/signature=[^&]+/, "signature=v1_x"), {
    host,
  });
  assert.notEqual(forged.status, 200, "a wrong signature is refused");
});

step("a signed upload URL writes only as its user, every part to its signed path", async () => {
  const up = new URL(await sbx.uploadUrl("pinned.txt", { useSignatureExpiration: 120 }));
  const b = "----forkdpinned";
  const part = (name: string, data: string) =>
    `--${b}\r\ncontent-disposition: form-data; name="file"; filename="${name}"\r\n\r\n${data}\r\n`;
  const body = Buffer.from(
    part("/etc/cron.d/forkd-x", "one") + part("/root/forkd-y", "two") + `--${b}--\r\n`,
  );
  const put = await raw(
    "POST",
    up.pathname + up.search,
    {
      host: `49983-${sbx.sandboxId}.e2b.test`,
      "content-type": `multipart/form-data; boundary=${b}`,
      authorization: "Basic cm9vdDo=",
    },
    body,
  );
  assert.equal(put.status, 200, put.body.toString());
  assert.equal(await sbx.files.exists("/etc/cron.d/forkd-x", { user: "root" }), false);
  assert.equal(await sbx.files.exists("/root/forkd-y", { user: "root" }), false);
  assert.equal(await sbx.files.read("pinned.txt"), "two");
  assert.equal((await sbx.files.getInfo("pinned.txt")).owner, "user", "written as the signed user");
});

step("the sandbox-wide env (envs: PATH, LD_PRELOAD) does not break envd's files", async () => {
  const other = await Sandbox.create(e.template, {
    timeoutMs: 300_000,
    requestTimeoutMs: 300_000,
    envs: { PATH: "/nonexistent", LD_PRELOAD: "/nonexistent/evil.so" },
  });
  try {
    await other.files.write("env/x.txt", "y");
    const info = await other.files.getInfo("env/x.txt");
    assert.equal(info.owner, "user");
    assert.deepEqual(
      (await other.files.list("env")).map((x) => x.name),
      ["x.txt"],
    );
  } finally {
    await other.kill().catch(() => undefined);
  }
});

step("pty: create, input, resize, kill", async () => {
  let out = "";
  const dec = new TextDecoder();
  const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => void (out += dec.decode(d)) });
  await sbx.pty.sendInput(t.pid, new TextEncoder().encode("stty size; echo marker-$((6*7))\n"));
  await waitFor("the pty's echo", () => out.includes("marker-42"));
  assert.match(out, /24 80/);
  await sbx.pty.resize(t.pid, { cols: 100, rows: 30 });
  await sbx.pty.sendInput(t.pid, new TextEncoder().encode("stty size\n"));
  await waitFor("the new size", () => out.includes("30 100"));
  assert.equal(await sbx.pty.kill(t.pid), true);
  await assert.rejects(t.wait());
});

step("another port: the guest's own HTTP service, proxied (exposed on first use)", async () => {
  const srv = await sbx.commands.run("python3 -m http.server 8000 --bind 0.0.0.0 --directory /home/user", {
    background: true,
    timeoutMs: 0,
  });
  const token = (sbx as unknown as { envdAccessToken: string }).envdAccessToken;
  const headers = { "e2b-sandbox-id": sbx.sandboxId, "e2b-sandbox-port": "8000", "x-access-token": token };
  let last: { status: number; body: Buffer } = { status: 0, body: Buffer.alloc(0) };
  await waitFor("the guest's server", async () => {
    last = await raw("GET", "/b.bin", headers);
    return last.status === 200;
  });
  assert.deepEqual([...last.body], [0, 1, 2, 255, 10]);
  const closed = await raw("GET", "/", { ...headers, "e2b-sandbox-port": "8001" });
  assert.equal(closed.status, 502, "a port nothing listens on");
  await srv.kill();
});

step("clients hanging up mid-stream: the process runs on, the daemon serves on", async () => {
  // Start: hang up after the first bytes (the start event); the process keeps running (E2B's).
  const msg = {
    process: {
      cmd: "/bin/bash",
      args: ["-c", "for i in $(seq 1 50); do echo line-$i; sleep 0.1; done > /tmp/bg.out"],
    },
  };
  await hangUpAfter("process.Process/Start", msg, 1);
  await waitFor(
    "the started process to finish on its own",
    async () => (await sbx.commands.run("cat /tmp/bg.out 2>/dev/null | wc -l")).stdout.trim() === "50",
  );
  // Connect to a chatty process and hang up mid-output: it still ends by itself.
  const h = await sbx.commands.run("for i in $(seq 1 100000); do echo $i; done; sleep 1", {
    background: true,
  });
  await hangUpAfter("process.Process/Connect", { process: { pid: h.pid } }, 4000);
  await h.wait();
  // WatchDir: hang up after the start event.
  await hangUpAfter("filesystem.Filesystem/WatchDir", { path: "/home/user" }, 1);
  const r = await sbx.commands.run("echo still-here");
  assert.equal(r.stdout, "still-here\n");
});

step(
  "revoking an API key: the access token it was given is a 401 and its streams end; others' work on",
  async () => {
    const rest = <T>(method: string, path: string) =>
      apiRequest<T>(e.daemon.ep, method, path, undefined, 60_000);
    const ids = async () =>
      (await rest<{ tokens: { id: string }[] }>("GET", "/v1/tokens")).tokens.map((t) => t.id);
    const before = await ids();
    const key = await e.keyFor(E2B_TENANT);
    const [id] = (await ids()).filter((x) => !before.includes(x));
    assert.ok(id);
    const mine = await Sandbox.connect(sbx.sandboxId, { apiKey: key });
    const token = (mine as unknown as { envdAccessToken: string }).envdAccessToken;
    assert.notEqual(
      token,
      (sbx as unknown as { envdAccessToken: string }).envdAccessToken,
      "each key its own",
    );
    // Streams opened with it: a background command (Start's stream) and a directory watch.
    const bg = await mine.commands.run("sleep 600", { background: true });
    let watchEnded: unknown = "not yet";
    const w = await mine.files.watchDir("/home/user", () => undefined, {
      onExit: (err) => {
        watchEnded = err;
      },
    });
    const ended = bg.wait().then(
      () => "exited",
      (err: unknown) => err,
    );
    await rest("DELETE", `/v1/tokens/${id}`);
    // Each ends by itself (the bound only guards a hang).
    const result = await Promise.race([
      ended,
      new Promise((r) => setTimeout(() => r("still running"), 60_000)),
    ]);
    assert.ok(result instanceof Error, `the command's stream: ${String(result)}`);
    await waitFor("the watch's end", () => watchEnded !== "not yet");
    await w.stop().catch(() => undefined);
    // The token is refused as revoked (not as a missing sandbox), through the SDK and raw.
    await assert.rejects(mine.commands.run("true"), (err: Error) => err.name === "AuthenticationError");
    const refused = await raw("GET", "/health", {
      "e2b-sandbox-id": sbx.sandboxId,
      "e2b-sandbox-port": "49983",
      "x-access-token": token,
    });
    assert.equal(refused.status, 401, refused.body.toString());
    assert.match(refused.body.toString(), /access token was revoked/);
    // The process itself is the sandbox's (E2B's envd keeps it too); the other key's handle works.
    assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid));
    await sbx.commands.kill(bg.pid);
    assert.equal((await sbx.commands.run("echo other-key")).stdout, "other-key\n");
  },
);

/** A command that prints a numbered line five times a second until it is stopped. */
const TICKER = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done";

/**
 * After a resume, background command `h` (started before the pause) is listed; a handle
 * connected now gets its later output, and so does `h`; it is killed; several runs all start.
 */
async function keptThroughPause(s: Sandbox, h: CommandHandle) {
  assert.ok(
    (await s.commands.list()).some((p) => p.pid === h.pid),
    "listed after the resume",
  );
  for (let i = 0; i < 5; i++) assert.equal((await s.commands.run(`echo run ${i}`)).stdout, `run ${i}\n`);
  const other = await s.commands.connect(h.pid, { timeoutMs: 0 });
  const seen = other.stdout.length;
  await waitFor("output to a handle connected after the resume", () =>
    /tick \d+\n/.test(other.stdout.slice(seen)),
  );
  const before = h.stdout.length;
  await waitFor("output to the handle from before the pause", () =>
    /tick \d+\n/.test(h.stdout.slice(before)),
  );
  assert.equal(await s.commands.kill(h.pid), true);
  await assert.rejects(
    other.wait(),
    (err: unknown) => err instanceof CommandExitError && /killed/.test(err.error ?? ""),
  );
  assert.ok(!(await s.commands.list()).some((p) => p.pid === h.pid), "gone once killed");
  assert.equal((await s.commands.run("echo after")).stdout, "after\n");
}

step("pause and resume with a command running: listed, connected to, killed; every run starts", async () => {
  const h = await sbx.commands.run(TICKER, { background: true, timeoutMs: 0 });
  await waitFor("its output", () => h.stdout.includes("tick 2"));
  assert.equal(await sbx.pause(), true);
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 900_000 });
  await keptThroughPause(sbx, h);
});

step(
  "E2B's auto-pause (a timeout that pauses) with a command running: the same after it resumes",
  async () => {
    const p = await Sandbox.create(e.template, {
      timeoutMs: 8_000,
      requestTimeoutMs: 300_000,
      lifecycle: { onTimeout: "pause", autoResume: false },
    });
    try {
      const h = await p.commands.run(TICKER, { background: true, timeoutMs: 0 });
      await waitFor("its output", () => h.stdout.includes("tick 2"));
      await waitFor("the pause at its timeout", async () => (await p.getInfo()).state === "paused", 180_000);
      await Sandbox.connect(p.sandboxId, { timeoutMs: 900_000 });
      await keptThroughPause(p, h);
    } finally {
      await p.kill().catch(() => undefined);
    }
  },
);
