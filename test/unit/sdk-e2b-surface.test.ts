/**
 * The TypeScript SDK's E2B surface against a fake daemon (no VMs): what it sends and how it reads
 * the replies — envs at creation, the user and home layout, a command timeout as TimeoutError,
 * iterating a handle, the list paginator, fork(count) with per-fork errors, pause and connect.
 */
import { afterEach, beforeEach, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import {
  CommandExitError,
  CommandTimeoutError,
  ForkdError,
  NotFoundError,
  Sandbox,
  TimeoutError,
} from "@forkd/sdk";

interface Req {
  method: string;
  path: string;
  query: URLSearchParams;
  body: unknown;
}
type Ev = Record<string, unknown>;

const b64 = (s: string) => Buffer.from(s).toString("base64");
const WITH_USER = "default root /root\nroot /root\nuser /home/user\n";

function view(id: string, state = "running", metadata: Record<string, string> = {}): Record<string, unknown> {
  return {
    id,
    tag: "snap",
    pid: 1,
    state,
    created: "2026-12-01T00:00:00.000Z",
    exit_reason: null,
    timings: { launch_ms: 1, restore_ms: 1, ready_ms: 1, total_ms: 3 },
    from_pool: false,
    timeout_ms: null,
    expires_at: null,
    ends_at: null,
    metadata,
    owner: null,
    limits: { memory_mib: null, cpus: null, pids: null, disk_mib: null, lifetime_ms: null },
    network: { mode: "none", guest_ip: null, egress: null, ports: [] },
  };
}

class Fake {
  reqs: Req[] = [];
  passwd = WITH_USER;
  sandboxes = new Map<string, Record<string, unknown>>([
    ["sb-aaaaaaaaaaaaaaaa", view("sb-aaaaaaaaaaaaaaaa")],
  ]);
  execReply: ((body: Record<string, unknown>) => Ev[]) | null = null;
  forkFailures: Ev[] = [];

  execs(): Array<Record<string, unknown>> {
    return this.reqs
      .filter((r) => r.path.endsWith("/exec/stream"))
      .map((r) => r.body as Record<string, unknown>);
  }

  handle(r: Req): [number, unknown] {
    this.reqs.push(r);
    const body = r.body as Record<string, unknown>;
    if (r.path === "/v1/sandboxes" && r.method === "POST") {
      const n = Number(body.n ?? 1);
      const failed = new Set(this.forkFailures.map((f) => f.index));
      const made = [];
      for (let i = 0; i < n; i++) {
        if (failed.has(i)) continue;
        const id = `sb-${String(this.sandboxes.size + i).padStart(16, "b")}`;
        const v = view(id);
        this.sandboxes.set(id, v);
        made.push(v);
      }
      return [201, { sandboxes: made, failures: this.forkFailures }];
    }
    if (r.path === "/v1/sandboxes" && r.method === "GET") {
      let items = [...this.sandboxes.values()].sort((a, b) => String(a.id).localeCompare(String(b.id)));
      const after = r.query.get("next_token");
      if (after) items = items.filter((v) => String(v.id) > after);
      const limit = Number(r.query.get("limit") ?? 100);
      const page = items.slice(0, limit);
      return [200, { sandboxes: page, next_token: items.length > limit ? page[page.length - 1]?.id : null }];
    }
    const m = /^\/v1\/sandboxes\/([^/]+)\/?(.*)$/.exec(r.path);
    if (m) {
      const sb = this.sandboxes.get(m[1] ?? "");
      const rest = m[2] ?? "";
      if (!sb) return [404, { error: { code: "not_found", message: `no sandbox ${m[1]}`, details: {} } }];
      if (rest === "" && r.method === "GET") return [200, sb];
      if (rest === "" && r.method === "DELETE") return [200, { deleted: m[1] }];
      if (rest === "pause") return [200, Object.assign(sb, { state: "paused" })];
      if (rest === "resume") return [200, Object.assign(sb, { state: "running" })];
      if (rest === "branch")
        return [201, { tag: body.tag, status: "ready", pause_ms: 1, private_bytes: 1, snapshot: null }];
      if (rest === "files" && r.method === "PUT") return [201, { path: r.query.get("path"), size: 2 }];
      if (rest === "exec/stream") return [200, this.exec(body)];
      if (rest.endsWith("/resize")) return [200, { pid: 7, cmd: "sh", started: "x", stdin_open: true }];
    }
    return [404, { error: { code: "not_found", message: `no route ${r.path}`, details: {} } }];
  }

  exec(body: Record<string, unknown>): Ev[] {
    const cmd = body.cmd;
    if (typeof cmd === "string" && cmd.includes("/etc/passwd"))
      return [
        { type: "started", pid: 1 },
        { type: "stdout", data: b64(this.passwd) },
        { type: "exit", exit_code: 0, signal: null, timed_out: false },
      ];
    if (this.execReply) return this.execReply(body);
    return [
      { type: "started", pid: 42 },
      { type: "exit", exit_code: 0, signal: null, timed_out: false },
    ];
  }
}

let fake: Fake;
let server: Server;
let url: string;

beforeEach(async () => {
  fake = new Fake();
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const u = new URL(req.url ?? "/", "http://x");
      const raw = Buffer.concat(chunks);
      const body: unknown =
        req.headers["content-type"] === "application/json" ? JSON.parse(raw.toString()) : raw;
      if (u.pathname.endsWith("/files/watch")) {
        // a stream the daemon holds open, as a watch's
        fake.reqs.push({ method: "GET", path: u.pathname, query: u.searchParams, body });
        const root = u.searchParams.get("path") ?? "";
        res.writeHead(200, { "content-type": "application/x-ndjson" });
        res.write(
          [
            { type: "ready" },
            { type: "create", path: `${root}/a.txt`, is_dir: false },
            { type: "write", path: `${root}/sub/b`, is_dir: false },
          ]
            .map((e) => JSON.stringify(e) + "\n")
            .join(""),
        );
        req.socket.once("close", () => res.end());
        return;
      }
      const [status, reply] = fake.handle({
        method: req.method ?? "GET",
        path: u.pathname,
        query: u.searchParams,
        body,
      });
      res.writeHead(status, { "content-type": "application/json" });
      res.end(
        Array.isArray(reply) ? reply.map((e) => JSON.stringify(e) + "\n").join("") : JSON.stringify(reply),
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterEach(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

const create = (o: Parameters<typeof Sandbox.create>[1] = {}) =>
  Sandbox.create("snap", { url, token: "t".repeat(40), ...o });
const conn = () => ({ url, token: "t".repeat(40) });

test("envs at creation are sent as env and every command sees them under its own", async () => {
  const sb = await create({ envs: { A: "1", B: "2" } });
  const made = fake.reqs.find((r) => r.method === "POST" && r.path === "/v1/sandboxes");
  assert.deepEqual((made?.body as { env?: unknown }).env, { A: "1", B: "2" });
  await sb.commands.run("echo $A", { envs: { B: "mine" } });
  assert.deepEqual(fake.execs().at(-1)?.env, { A: "1", B: "mine" });
});

test("user is sent; by default the E2B account `user` in its home when the image has it", async () => {
  const sb = await create();
  await sb.commands.run("whoami", { user: "root" });
  assert.deepEqual([fake.execs().at(-1)?.user, fake.execs().at(-1)?.cwd], ["root", "/root"]);
  await sb.commands.run("whoami");
  assert.deepEqual([fake.execs().at(-1)?.user, fake.execs().at(-1)?.cwd], ["user", "/home/user"]);
  assert.equal((await sb.files.write("d/x", "hi")).path, "/home/user/d/x");
  assert.match(String(fake.execs().at(-1)?.cmd), /^chown 'user': -- '\/home\/user\/d\/x'$/);
});

test("an image without the account keeps its default user (root) and its home", async () => {
  fake.passwd = "default root /root\nroot /root\n";
  const sb = await create();
  await sb.commands.run("whoami");
  assert.deepEqual([fake.execs().at(-1)?.user, fake.execs().at(-1)?.cwd], ["root", "/root"]);
  assert.equal((await sb.files.write("x", "hi")).path, "/root/x");
});

test("a command timeout is a TimeoutError (also at the end of iterating); an exit code a CommandExitError", async () => {
  fake.execReply = () => [
    { type: "started", pid: 7 },
    { type: "stdout", data: b64("partial") },
    { type: "exit", exit_code: null, signal: 9, timed_out: true },
  ];
  const sb = await create();
  await assert.rejects(sb.commands.run("sleep 10", { timeoutMs: 2000 }), (e: unknown) => {
    assert.ok(e instanceof CommandTimeoutError && e instanceof TimeoutError);
    assert.equal(e.stdout, "partial");
    return true;
  });
  const h = await sb.commands.run("sleep 10", { timeoutMs: 2000, background: true });
  const seen: unknown[] = [];
  await assert.rejects(async () => {
    for await (const c of h) seen.push(c);
  }, CommandTimeoutError);
  assert.deepEqual(seen, [{ stdout: "partial" }]);
  fake.execReply = () => [
    { type: "started", pid: 8 },
    { type: "stderr", data: b64("bad\n") },
    { type: "exit", exit_code: 3, signal: null, timed_out: false },
  ];
  await assert.rejects(
    sb.commands.run("exit 3"),
    (e: unknown) => e instanceof CommandExitError && e.exitCode === 3 && e.stderr === "bad\n",
  );
});

test("Sandbox.list is E2B's paginator (and awaiting it gives every page); kill of a missing sandbox is false", async () => {
  fake.sandboxes.clear();
  for (let i = 0; i < 5; i++) fake.sandboxes.set(`sb-c${i}`, view(`sb-c${i}`, "running", { k: "v" }));
  const p = Sandbox.list({ ...conn(), query: { metadata: { k: "v" }, state: ["running"] }, limit: 2 });
  const sizes: number[] = [];
  while (p.hasNext) sizes.push((await p.nextItems()).length);
  assert.deepEqual(sizes, [2, 2, 1]);
  const q = fake.reqs.find((r) => r.method === "GET" && r.path === "/v1/sandboxes")?.query;
  assert.deepEqual([q?.get("state"), q?.get("metadata"), q?.get("limit")], ["running", "k=v", "2"]);
  assert.equal((await Sandbox.list(conn())).length, 5);
  assert.equal(await Sandbox.kill("sb-zzzzzzzzzzzzzzzz", conn()), false);
  await assert.rejects(Sandbox.getInfo("sb-zzzzzzzzzzzzzzzz", conn()), NotFoundError);
});

test("fork({count}) branches once and returns a sandbox or an error per fork", async () => {
  const sb = await create({ envs: { E: "1" } });
  fake.forkFailures = [{ index: 1, code: "vmm_error", message: "no memory" }];
  const out = await sb.fork({ count: 3 });
  assert.deepEqual(
    out.map((x) => (x instanceof Sandbox ? "sandbox" : x instanceof ForkdError ? x.message : "?")),
    ["sandbox", "no memory", "sandbox"],
  );
  const branch = fake.reqs.find((r) => r.path.endsWith("/branch"))?.body as { tag: string };
  const made = fake.reqs.filter((r) => r.method === "POST" && r.path === "/v1/sandboxes").at(-1)?.body;
  assert.deepEqual(made, { snapshot_tag: branch.tag, n: 3, env: { E: "1" } });
});

test("pause says whether it paused; connect resumes a paused sandbox; timeoutMs and lifecycle are the deadline's", async () => {
  const id = "sb-aaaaaaaaaaaaaaaa";
  assert.equal(await Sandbox.pause(id, conn()), true);
  assert.equal(await Sandbox.pause(id, conn()), false);
  const sb = await Sandbox.connect(id, conn());
  assert.equal(sb.sandboxId, id);
  assert.equal(fake.sandboxes.get(id)?.state, "running");
  await create({ lifecycle: { onTimeout: "pause" }, timeoutMs: 60_000, idleTimeoutMs: 30_000 });
  const made = fake.reqs.filter((r) => r.method === "POST" && r.path === "/v1/sandboxes").at(-1)?.body;
  assert.deepEqual(made, {
    snapshot_tag: "snap",
    n: 1,
    deadline_ms: 60_000,
    timeout_ms: 30_000,
    on_deadline: "pause",
  });
});

test("pty.create runs a shell on a terminal of the size, its output as bytes; resize posts the size", async () => {
  fake.execReply = () => [
    { type: "started", pid: 7 },
    { type: "stdout", data: b64("\x1b[1mhi\r\n") },
    { type: "exit", exit_code: 0, signal: null, timed_out: false },
  ];
  const sb = await create();
  const got: string[] = [];
  const h = await sb.pty.create({ rows: 24, cols: 80, onData: (d) => got.push(Buffer.from(d).toString()) });
  const body = fake.execs().at(-1);
  assert.deepEqual(body?.pty, { rows: 24, cols: 80 });
  assert.equal(body?.keep_stdin_open, undefined);
  assert.equal((await h.wait()).exitCode, 0);
  assert.deepEqual([got, h.stdout], [["\x1b[1mhi\r\n"], ""]);
  await sb.pty.resize(7, { rows: 50, cols: 132 });
  assert.deepEqual(fake.reqs.find((r) => r.path.endsWith("/commands/7/resize"))?.body, {
    rows: 50,
    cols: 132,
  });
});

test("files.watchDir names events under the directory (a relative one under the home); stop ends it", async () => {
  const sb = await create();
  const seen: Array<[string, string]> = [];
  let exited = false;
  const w = await sb.files.watchDir("w", (e) => void seen.push([e.name, e.type]), {
    recursive: true,
    onExit: () => (exited = true),
  });
  const q = fake.reqs.find((r) => r.path.endsWith("/files/watch"))?.query;
  assert.deepEqual([q?.get("path"), q?.get("recursive")], ["/home/user/w", "1"]);
  for (let i = 0; i < 100 && seen.length < 2; i++) await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(seen, [
    ["a.txt", "create"],
    ["sub/b", "write"],
  ]);
  await w.stop();
  for (let i = 0; i < 100 && !exited; i++) await new Promise((r) => setTimeout(r, 20));
  assert.equal(exited, true);
});
