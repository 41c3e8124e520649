/**
 * A client that hangs up never hurts the daemon. At every streamed route (exec stream, snapshot
 * creation, push and pull with ?stream=1, the pack and file downloads) a raw client on the unix
 * socket hangs up before the first byte of the reply, after its first event or chunk, and in the
 * middle of it. After each, the daemon is the same process and answers, nothing it did was
 * reported as a bug in its log, and the work ended cleanly: an exec's command is killed and its
 * sandbox not left busy; a snapshot creation is cancelled (its parent VM killed, nothing
 * published, staged or pre-started: a client's Ctrl-C, as `docker build`'s), also one that was
 * not streamed; a push or pull runs to its end; a pack writer stops and leaves nothing staged. Ctrl-C on `forkd exec`
 * exits 130 with the command killed; a buffered exec and a cut upload hurt nothing either; and
 * at the end the sandbox used throughout still idles out (no hang-up left it busy).
 *
 * One daemon, one small snapshot and one sandbox for the whole file. Push and pull go through a
 * proxy that delays every registry request, so "the middle" of their progress is a real middle.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { createServer, request } from "node:http";
import type { Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { rawRequest, readAll } from "../helpers/http.js";
import { pidsReferencing } from "../../src/util/proc.js";
import { api, forkOne, sh } from "../helpers/vm.js";
import { CLI, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { parseMetrics } from "../helpers/prometheus.js";
import { startRegistry } from "../helpers/registry.js";
import type { TestRegistry } from "../helpers/registry.js";
import { steps } from "../helpers/steps.js";

const sh$ = promisify(execFile);
const { step, failed } = steps();
let d: TestDaemon;
let pid: number;
let reg: TestRegistry;
let proxy: Server;
let slowHost = "";
let work: string;

type When = "before" | "first" | "mid";
const WHEN: When[] = ["before", "first", "mid"];

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-hangups-"));
  reg = await startRegistry(work);
  proxy = await delayingProxy(reg.host, 150);
  const a = proxy.address() as { port: number };
  slowHost = `127.0.0.1:${a.port}`;
  d = await makeDaemon({ FORKD_POOL_SIZE: "0" });
  pid = d.proc.pid ?? 0;
  await api(d, "POST", "/v1/snapshots", { tag: "hbase", memory_mib: 256 });
});

after(async () => {
  proxy?.closeAllConnections();
  proxy?.close();
  await d?.destroy(failed());
  await reg?.stop();
  if (failed()) process.stderr.write(`hang-up test artefacts kept in ${work}\n`);
  else await rm(work, { recursive: true, force: true });
});

/** An http proxy to `target` that holds every request `ms` before passing it on. */
async function delayingProxy(target: string, ms: number): Promise<Server> {
  const [host, port] = target.split(":");
  const server = createServer((req, res) => {
    setTimeout(() => {
      const up = request(
        { host, port: Number(port), method: req.method, path: req.url, headers: req.headers },
        (r) => {
          res.writeHead(r.statusCode ?? 502, r.headers);
          r.pipe(res);
        },
      );
      up.on("error", () => res.destroy());
      req.pipe(up);
    }, ms);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return server;
}

/**
 * One request on the daemon's socket that the client abandons: "before" as soon as the request
 * is sent, without reading a byte of the reply; "first" on the reply's first chunk (an NDJSON
 * reply's first line); "mid" once `mid(received)` holds. A reply that ends before its hang-up
 * fails the test (the hang-up would not have been one).
 */
function hangUp(
  method: string,
  path: string,
  body: unknown,
  when: When,
  mid: (got: string, bytes: number) => boolean,
): Promise<{ status: number | null; got: string }> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? "" : JSON.stringify(body);
    const req = request({
      socketPath: d.ep.socket,
      method,
      path,
      headers: payload
        ? { "content-type": "application/json", "content-length": Buffer.byteLength(payload) }
        : {},
    });
    let status: number | null = null;
    let got = "";
    let bytes = 0;
    let cut = false;
    const hang = () => {
      cut = true;
      req.destroy();
      resolve({ status, got });
    };
    req.on("error", (e) => cut || reject(e));
    if (when === "before") req.on("finish", hang);
    req.on("response", (res) => {
      status = res.statusCode ?? null;
      res.on("error", () => undefined);
      res.on("data", (c: Buffer) => {
        if (cut) return;
        bytes += c.length;
        if (got.length < 1 << 16) got += c.toString("latin1");
        if (status !== 200 && status !== 201) return;
        if (when === "first" || mid(got, bytes)) hang();
      });
      res.on("close", () => cut || reject(new Error(`${path}: the reply (${status}) ended first: ${got}`)));
    });
    req.end(payload || undefined);
  });
}

/** The daemon is the process it was, answers, and has logged no bug. */
async function assertAlive(what: string): Promise<void> {
  assert.equal(d.proc.exitCode, null, `${what}: the daemon exited (see ${d.dataDir}/daemon.log)`);
  assert.equal(d.proc.signalCode, null, `${what}: the daemon was killed`);
  assert.equal(d.proc.pid, pid);
  const v = await api<{ api: string }>(d, "GET", "/v1/version");
  assert.equal(v.api, "v1");
  const log = await readFile(join(d.dataDir, "daemon.log"), "utf8");
  assert.doesNotMatch(log, /unhandled promise rejection|uncaught exception|ERR_INVALID_STATE/, what);
}

/** Polls `ok` until it holds (the deadline is a backstop against a hang, not a measurement). */
async function until(what: string, ok: () => Promise<boolean>, ms = 180_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await ok())) {
    if (Date.now() > deadline) assert.fail(`${what}: not within ${ms / 1000} s`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** How many requests of this route template reached the API (any status). */
async function served(route: string): Promise<number> {
  const res = await fetchMetrics();
  let n = 0;
  for (const f of res.values()) {
    for (const s of f.samples) {
      if (s.name === "forkd_http_request_duration_seconds_count" && s.labels.route === route) n += s.value;
    }
  }
  return n;
}

async function fetchMetrics() {
  const res = await rawRequest(d.ep, "GET", "/metrics", undefined, 30_000);
  return parseMetrics((await readAll(res)).toString("utf8"));
}

const lines = (got: string) => got.split("\n").filter((l) => l.trim().length > 0);
const snapshotStatus = async (tag: string): Promise<string> => {
  const { snapshots, pending } = await api<{
    snapshots: { tag: string; status: string }[];
    pending: { tag: string; status: string }[];
  }>(d, "GET", "/v1/snapshots");
  return [...snapshots, ...pending].find((s) => s.tag === tag)?.status ?? "absent";
};

step(
  "snapshot creations whose client hangs up are cancelled (docker build's Ctrl-C): nothing published or left",
  async () => {
    const cases = WHEN.map((when) => ({
      tag: `hc-${when}`,
      when,
      body: { tag: `hc-${when}`, memory_mib: 256 },
    }));
    // Together (each boots a parent VM): hung up before the reply, after its first line, or once
    // the parent VM booted (the middle of the creation).
    const streamed = Promise.all(
      cases.map(({ body, when }) =>
        hangUp("POST", "/v1/snapshots?stream=1", body, when, (got) => got.includes("boot: agent ready")),
      ),
    );
    // And a plain creation (one reply when done) whose client hangs up while it runs.
    const plain = request({
      socketPath: d.ep.socket,
      method: "POST",
      path: "/v1/snapshots",
      headers: { "content-type": "application/json" },
    });
    plain.on("error", () => undefined);
    plain.end(JSON.stringify({ tag: "hc-plain", memory_mib: 256 }));
    await until("the plain creation runs", async () => (await snapshotStatus("hc-plain")) === "writing");
    plain.destroy();
    await streamed;
    await assertAlive("snapshot creations hung up");
    const tags = [...cases.map((c) => c.tag), "hc-plain"];
    for (const tag of tags) {
      await until(`${tag} settles`, async () => (await snapshotStatus(tag)) !== "writing");
      assert.equal(await snapshotStatus(tag), "absent", `${tag}: cancelled, not ready nor failed`);
    }
    await assertAlive("snapshot creations cancelled");
    // No parent VM runs on, nothing is staged, nothing is pre-started for them.
    const run = join(d.dataDir, "run");
    await until("no parent VM left", async () => (await pidsReferencing(`${run}/p-`)).length === 0);
    assert.deepEqual(
      (await readdir(run)).filter((n) => n.startsWith("p-")),
      [],
    );
    const staged = (await readdir(join(d.dataDir, "snapshots"))).filter((n) => n.startsWith(".staging-"));
    assert.deepEqual(staged, []);
    const health = await api<{ pool_state?: { tags: Record<string, unknown> } }>(d, "GET", "/v1/health");
    for (const tag of tags) assert.equal(health.pool_state?.tags[tag], undefined, tag);
    const log = await readFile(join(d.dataDir, "daemon.log"), "utf8");
    assert.match(log, /snapshot hc-mid: its client went away; cancelled/);
    // The same tag can be made again at once (nothing of the cancelled one holds it).
    await api(d, "POST", "/v1/snapshots", { tag: "hc-mid", memory_mib: 256 });
    const id = await forkOne(d, "hc-mid");
    assert.equal(await sh(d, id, "echo forked"), "forked\n");
    await api(d, "DELETE", `/v1/sandboxes/${id}`);
  },
);

step("push and pull with ?stream=1 whose client hangs up run to their end", async () => {
  // Pushed once in full, straight to the registry; hung-up pushes and pulls go through the
  // delaying proxy (blobs there already: only lookups, each one held).
  await api(d, "POST", "/v1/snapshots/hbase/push", { ref: `${reg.host}/forkd/hbase:full` });
  const mid = (got: string) => lines(got).length >= 2;
  for (const when of WHEN) {
    const r = await hangUp(
      "POST",
      "/v1/snapshots/hbase/push?stream=1",
      { ref: `${slowHost}/forkd/hbase:p-${when}` },
      when,
      mid,
    );
    if (when !== "before") assert.doesNotMatch(r.got, /"type":"(done|error)"/, `${when}: hung up mid-push`);
    await assertAlive(`push hung up ${when}`);
  }
  for (const when of WHEN) {
    await until(`push p-${when} completes`, async () => {
      const res = await fetch(`http://${reg.host}/v2/forkd/hbase/manifests/p-${when}`, {
        method: "HEAD",
        headers: { accept: "application/vnd.oci.image.manifest.v1+json" },
      });
      return res.status === 200;
    });
  }
  for (const when of WHEN) {
    const r = await hangUp(
      "POST",
      "/v1/snapshots/pull?stream=1",
      { ref: `${slowHost}/forkd/hbase:full`, tag: `hp-${when}` },
      when,
      mid,
    );
    if (when !== "before") assert.doesNotMatch(r.got, /"type":"(done|error)"/, `${when}: hung up mid-pull`);
    await assertAlive(`pull hung up ${when}`);
  }
  for (const when of WHEN) {
    await until(`pull hp-${when} is ready`, async () => (await snapshotStatus(`hp-${when}`)) === "ready");
  }
  await assertAlive("pushes and pulls settled");
});

/** The daemon's tar children and its pack staging directories (a pack writer's traces). */
async function packTraces(): Promise<{ tars: number; staged: string[] }> {
  const { stdout } = await sh$("ps", ["-o", "comm=", "--ppid", String(pid)]).catch(() => ({ stdout: "" }));
  const tars = stdout.split("\n").filter((c) => c.trim() === "tar").length;
  const staged = (await readdir(join(d.dataDir, "snapshots"))).filter((n) => n.startsWith(".staging-pack-"));
  return { tars, staged };
}

step("a pack download whose client hangs up stops its writer and leaves nothing staged", async () => {
  const route = "/v1/snapshots/{tag}/pack";
  for (const when of WHEN) {
    const before = await served(route);
    await hangUp("GET", "/v1/snapshots/hbase/pack", undefined, when, (_got, bytes) => bytes >= 4 << 20);
    await assertAlive(`pack hung up ${when}`);
    await until(`pack ${when} was served`, async () => (await served(route)) > before, 30_000);
    await until(`pack ${when}: writer gone`, async () => {
      const t = await packTraces();
      return t.tars === 0 && t.staged.length === 0;
    });
  }
  // A later pack is whole: tar reads it to its end.
  const file = join(work, "hbase.forkd.tar.zst");
  await sh$("sh", [
    "-c",
    `curl -sf --unix-socket ${d.ep.socket} http://forkd/v1/snapshots/hbase/pack -o ${file}`,
  ]);
  const { stdout } = await sh$("tar", ["--zstd", "-tf", file], { maxBuffer: 1 << 20 });
  assert.ok(stdout.split("\n").includes("./manifest.json"), stdout);
  assert.deepEqual(await packTraces(), { tars: 0, staged: [] });
});

let id = "";
const MARK = (when: string) => `hangup-marker-${when}`;
/** Processes in the guest whose command line has the marker (the pattern does not match itself). */
const marked = async (when: string) => {
  const m = MARK(when);
  const pattern = `${m.slice(0, -1)}[${m.slice(-1)}]`;
  return (await sh(d, id, `grep -las '${pattern}' /proc/[0-9]*/cmdline || true`)).trim();
};

step("an exec stream whose client hangs up has its command killed; the daemon lives", async () => {
  id = await forkOne(d, "hbase");
  const route = "/v1/sandboxes/{id}/exec/stream";
  for (const when of WHEN) {
    const script = 'echo go; i=0; while :; do echo "line $i"; i=$((i+1)); sleep 0.02; done';
    const before = await served(route);
    const r = await hangUp(
      "POST",
      `/v1/sandboxes/${id}/exec/stream`,
      { cmd: ["sh", "-c", script, MARK(when)] },
      when,
      (got) => lines(got).filter((l) => l.includes('"stdout"')).length >= 5,
    );
    await assertAlive(`exec hung up ${when}`);
    // The request reached the route (so the hang-up met the stream, not a closed socket).
    await until(`exec ${when} was served`, async () => (await served(route)) > before, 30_000);
    if (when === "first") assert.match(r.got, /"type":"(started|stdout)"/);
    await until(`exec ${when}: command gone`, async () => {
      const { commands } = await api<{ commands: unknown[] }>(d, "GET", `/v1/sandboxes/${id}/commands`);
      return commands.length === 0 && (await marked(when)) === "";
    });
  }
  await assertAlive("exec streams ended");
});

step("Ctrl-C on forkd exec exits 130 and the command is killed; the daemon lives", async () => {
  const script = 'i=0; while :; do echo "line $i"; i=$((i+1)); sleep 0.02; done';
  const child = spawn(process.execPath, [CLI, "exec", id, "--", "sh", "-c", script, MARK("cli")], {
    env: d.env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  let out = "";
  let err = "";
  child.stderr.on("data", (c: Buffer) => (err += c.toString()));
  await new Promise<void>((resolve, reject) => {
    child.stdout.on("data", (c: Buffer) => {
      out += c.toString();
      if (out.includes("line 3\n")) resolve();
    });
    void exited.then(() => reject(new Error(`forkd exec ended before its output: ${err}`)));
  });
  child.kill("SIGINT");
  assert.equal(await exited, 130, err);
  assert.match(err, /interrupted/);
  await assertAlive("forkd exec interrupted");
  await until("the interrupted command is gone", async () => {
    const { commands } = await api<{ commands: unknown[] }>(d, "GET", `/v1/sandboxes/${id}/commands`);
    return commands.length === 0 && (await marked("cli")) === "";
  });
});

step("replies that are not streams: a buffered exec and an upload cut mid-body", async () => {
  await hangUp(
    "POST",
    `/v1/sandboxes/${id}/exec`,
    { cmd: ["sh", "-c", "sleep 1", MARK("buffered")] },
    "before",
    () => false,
  );
  await assertAlive("buffered exec hung up");
  await until("the buffered exec's command ends", async () => (await marked("buffered")) === "");
  // An upload that stops a quarter of the way through: no file, nothing half-written.
  await new Promise<void>((resolve) => {
    const req = request({
      socketPath: d.ep.socket,
      method: "PUT",
      path: `/v1/sandboxes/${id}/files?path=/root/upload`,
      headers: { "content-type": "application/octet-stream", "content-length": 4 << 20 },
    });
    req.on("error", () => resolve());
    req.write(Buffer.alloc(1 << 20, 7), () => setTimeout(() => (req.destroy(), resolve()), 200));
  });
  await assertAlive("upload cut");
  // The file is not replaced by a partial one, and the next upload works. (The guest keeps the
  // abandoned write's temporary until the agent's write times out: AgentClient.writeFile does
  // not end the guest's write when its source fails.)
  assert.doesNotMatch(await sh(d, id, "ls /root"), /^upload$/m);
  const put = await rawRequest(d.ep, "PUT", `/v1/sandboxes/${id}/files?path=/root/upload`, "whole", 30_000);
  assert.equal(put.statusCode, 201, (await readAll(put)).toString());
  assert.equal(await sh(d, id, "cat /root/upload"), "whole");
});

step("a file download whose client hangs up ends; the sandbox still serves files", async () => {
  const size = 16 << 20;
  await sh(d, id, `head -c ${size} /dev/zero > /root/big && sync`);
  const path = `/v1/sandboxes/${id}/files?path=/root/big`;
  for (const when of WHEN) {
    await hangUp("GET", path, undefined, when, (_got, bytes) => bytes >= 1 << 20);
    await assertAlive(`file download hung up ${when}`);
  }
  const { stdout } = await sh$("sh", [
    "-c",
    `curl -sf --unix-socket ${d.ep.socket} 'http://forkd${path}' | wc -c`,
  ]);
  assert.equal(Number(stdout.trim()), size);
});

step("no hang-up left the sandbox busy: its idle timeout still ends it", async () => {
  // An operation that never released the sandbox keeps it busy, and a busy sandbox never idles.
  await api(d, "POST", `/v1/sandboxes/${id}/timeout`, { timeout_ms: 1000 });
  await until("the idle timeout ends the sandbox", async () => {
    const v = await api<{ state: string; exit_reason: string | null }>(d, "GET", `/v1/sandboxes/${id}`);
    return v.state === "exited";
  });
  const v = await api<{ exit_reason: string | null }>(d, "GET", `/v1/sandboxes/${id}`);
  assert.match(v.exit_reason ?? "", /idle/);
  await assertAlive("at the end");
});
