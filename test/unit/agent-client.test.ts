/**
 * The host's agent client against the real guest agent binary, run on the host over a
 * socketpair (no VM): the protocol contract both sides are written to.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { AgentClient } from "../../src/agent/client.js";
import { withStartExplained } from "../../src/agent/exec-start.js";
import { ForkdError } from "../../src/util/errors.js";
import { startHostAgent } from "../helpers/agent.js";
import type { HostAgent } from "../helpers/agent.js";

let host: HostAgent;
let agent: AgentClient;
let dir: string;

before(async () => {
  host = await startHostAgent({ python: true, stdio: "inherit" });
  agent = host.agent;
  dir = host.dir;
});

after(async () => {
  await host.close();
});

const collect = async (
  argv: string[] | string,
  opts: { timeoutMs?: number; env?: Record<string, string>; cwd?: string; user?: string } = {},
) => {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const h = agent.exec(
    { ...(typeof argv === "string" ? { shell: argv } : { argv }), ...opts },
    { onStdout: (d) => out.push(d), onStderr: (d) => err.push(d) },
  );
  const r = await h.result;
  return { ...r, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() };
};

test("ping reports protocol version 1 and a ready interpreter", async () => {
  const p = await agent.ping();
  assert.equal(p.version, 1);
  assert.equal(p.evalReady, true);
});

test("exec: argv, shell, env, cwd, exit codes", async () => {
  assert.deepEqual(await collect(["echo", "a b"]), {
    exitCode: 0,
    signal: null,
    timedOut: false,
    stdout: "a b\n",
    stderr: "",
  });
  const r = await collect("echo $FOO; pwd; echo err >&2; exit 3", { env: { FOO: "bar" }, cwd: "/tmp" });
  assert.equal(r.stdout, "bar\n/tmp\n");
  assert.equal(r.stderr, "err\n");
  assert.equal(r.exitCode, 3);
});

test("exec: a missing program is an error, not a hang", async () => {
  const r = await collect(["/nonexistent/program"]).catch((e: unknown) => e);
  if (r instanceof ForkdError) assert.match(r.message, /nonexistent|No such file/);
  else assert.equal((r as { exitCode: number }).exitCode, 127);
});

test("exec: output streams before the command ends", async () => {
  const t0 = Date.now();
  let firstAt = 0;
  const h = agent.exec(
    { shell: "echo first; sleep 1; echo second" },
    {
      onStdout: () => {
        if (!firstAt) firstAt = Date.now() - t0;
      },
    },
  );
  await h.result;
  const total = Date.now() - t0;
  assert.ok(firstAt > 0 && total - firstAt >= 700, `first output at ${firstAt} ms, end at ${total} ms`);
});

test("exec: timeout kills the whole process group", async () => {
  const marker = join(dir, "bg-alive");
  const r = await collect(`(sleep 2; touch ${marker}) & sleep 30`, { timeoutMs: 300 });
  assert.equal(r.timedOut, true);
  assert.equal(r.signal, 9);
  await new Promise((res) => setTimeout(res, 2500));
  assert.equal(existsSync(marker), false, "the background child survived the timeout");
});

test("exec: stdin streams in and signals reach the command", async () => {
  const out: Buffer[] = [];
  const h = agent.exec({ argv: ["cat"], stdin: true }, { onStdout: (d) => out.push(d) });
  h.writeStdin(Buffer.from("hello "));
  h.writeStdin(Buffer.from("world"));
  h.closeStdin();
  assert.equal((await h.result).exitCode, 0);
  assert.equal(Buffer.concat(out).toString(), "hello world");
  const s = agent.exec({ argv: ["sleep", "30"] });
  await s.started;
  s.signal(15);
  assert.equal((await s.result).signal, 15);
});

test("exec: 50 concurrent commands each get their own output", async () => {
  const rs = await Promise.all(
    Array.from({ length: 50 }, (_, i) => collect(`sleep 0.$((RANDOM % 3)); echo ${i}`)),
  );
  rs.forEach((r, i) => assert.equal(r.stdout, `${i}\n`));
});

test("files: binary round trip of 5 MiB, list, stat, mkdir -p, rename, remove -r", async () => {
  const data = Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), randomBytes(5 << 20)]);
  const p = join(dir, "a/b/c/blob.bin");
  await agent.mkdir(join(dir, "a/b/c"), { parents: true });
  assert.equal(await agent.writeFile(p, data), data.length);
  assert.ok((await agent.readFile(p)).equals(data));
  const st = await agent.stat(p);
  assert.equal(st.type, "file");
  assert.equal(st.size, data.length);
  await agent.rename(p, join(dir, "a/moved.bin"));
  const names = (await agent.list(join(dir, "a"))).map((e) => `${e.name}:${e.type}`);
  assert.deepEqual(names, ["b:dir", "moved.bin:file"]);
  await agent.remove(join(dir, "a"), { recursive: true });
  await assert.rejects(
    agent.stat(join(dir, "a")),
    (e: unknown) => e instanceof ForkdError && e.code === "not_found",
  );
});

test("files: errors carry errno and map to codes", async () => {
  await assert.rejects(
    agent.readFile("/nonexistent/x"),
    (e: unknown) => e instanceof ForkdError && e.code === "not_found",
  );
  await assert.rejects(
    agent.writeFile("/nonexistent/dir/x", Buffer.from("x")),
    (e: unknown) => e instanceof ForkdError && e.code === "not_found",
  );
  await agent.mkdir(join(dir, "d"));
  await assert.rejects(
    agent.mkdir(join(dir, "d")),
    (e: unknown) => e instanceof ForkdError && e.code === "conflict",
  );
});

test("eval: notebook cells with persistent globals, output capture, tracebacks", async () => {
  const a = await agent.eval("x = 20\nx + 22");
  assert.equal(a.ok, true);
  assert.equal(a.value, "42");
  const b = await agent.eval("print('hi'); x * 2");
  assert.equal(b.stdout, "hi\n");
  assert.equal(b.value, "40");
  const c = await agent.eval("def f():\n    return 1/0\nf()");
  assert.equal(c.ok, false);
  assert.equal(c.error?.name, "ZeroDivisionError");
  assert.match(c.error?.traceback ?? "", /in f/);
});

test("eval: a runaway cell is interrupted and globals survive", async () => {
  await agent.eval("kept = 'yes'");
  await assert.rejects(
    agent.eval("while True: pass", 500),
    (e: unknown) => e instanceof ForkdError && e.code === "timeout",
  );
  assert.equal((await agent.eval("kept")).value, "'yes'");
});

test("exec: a cwd that does not exist, or is a file, is named as the cause", async () => {
  const req = { shell: "pwd", cwd: "/nonexistent-cwd" };
  const h = withStartExplained(agent, req, agent.exec(req));
  const e = await h.result.catch((x: unknown) => x);
  assert.ok(e instanceof ForkdError, String(e));
  // The agent alone reads as a missing shell; the host says what was wrong.
  assert.equal(e.message, "cwd /nonexistent-cwd does not exist in the sandbox (ENOENT)");
  assert.equal(e.code, "invalid_argument");
  const file = join(dir, "a-file");
  await writeFile(file, "x");
  const f = { argv: ["pwd"], cwd: file };
  const e2 = await withStartExplained(agent, f, agent.exec(f)).result.catch((x: unknown) => x);
  assert.ok(e2 instanceof ForkdError);
  assert.equal(e2.message, `cwd ${file} is not a directory in the sandbox (ENOTDIR)`);
  // A missing program in an existing cwd keeps the agent's words.
  const p = { argv: ["/nonexistent/program"], cwd: "/tmp" };
  const e3 = await withStartExplained(agent, p, agent.exec(p)).result.catch((x: unknown) => x);
  if (e3 instanceof ForkdError) assert.match(e3.message, /^cannot start \/nonexistent\/program/);
  else assert.equal((e3 as { exitCode: number }).exitCode, 127);
});

test("ping reports the kernels the guest has (python here: no JavaScript kernel source on the host)", async () => {
  assert.deepEqual((await agent.ping()).kernels, ["python"]);
});

test("exec: `user` runs the command as that user of the image, an unknown one is invalid_argument", async () => {
  const uid = process.getuid?.() ?? -1;
  if (uid !== 0) return; // switching users needs root (the agent is PID 1 in a guest)
  const r = await collect('id -un; id -u; echo "$HOME|$USER|$LOGNAME"', { user: "nobody" });
  assert.deepEqual([r.exitCode, r.stdout], [0, "nobody\n65534\n/nonexistent|nobody|nobody\n"]);
  const g = await collect("id -u; id -g", { user: "65534:12345" });
  assert.equal(g.stdout, "65534\n12345\n");
  const root = await collect("id -u; echo $HOME", { user: "root" });
  assert.equal(root.stdout, "0\n/root\n");
  const e = await collect("true", { user: "no-such-user-here" }).catch((x: unknown) => x);
  assert.ok(e instanceof ForkdError, String(e));
  assert.equal(e.code, "invalid_argument");
  assert.equal(e.details.field, "user");
  assert.match(e.message, /^no user 'no-such-user-here' in the image's \/etc\/passwd/);
});

test("eval: a language whose kernel the image cannot run is unavailable, at once", async () => {
  const t0 = Date.now();
  const e = await agent.eval("1 + 1", 30_000, "javascript").catch((x: unknown) => x);
  assert.ok(e instanceof ForkdError, String(e));
  assert.equal(e.code, "unavailable");
  assert.equal(e.details.language, "javascript");
  // node on the host's PATH but no /.forkd/forkd_eval.js, or no node at all: either is named
  assert.match(e.message, /forkd_eval\.js is missing|no node interpreter/);
  assert.ok(Date.now() - t0 < 5_000);
  assert.equal((await agent.eval("1 + 1", 30_000, "python")).value, "2");
});
