/**
 * Access control, limits, audit and metrics on a real daemon serving HTTPS on TCP (a self-signed
 * certificate made here with openssl) with real VMs:
 *   - tokens are made with the CLI over the unix socket; no token or a wrong one is 401;
 *   - a tenant's sandbox is invisible to another tenant: get, exec, files and kill are 404 with
 *     the message of a sandbox that does not exist;
 *   - oversized bodies are 413 (JSON and a streamed upload, declared or not), a burst is 429;
 *   - both SDKs work over HTTPS with a tenant token and see only that tenant's sandboxes;
 *   - /metrics parses with the official Python client's parser and moves with a fork;
 *   - revoking a token ends at once, with the reason, the event stream, the exec stream and the
 *     terminal it opened (the command is killed), and nothing another token opened;
 *   - every mutating call made here has its audit line (caller, action, status, result).
 * Every JSON reply is checked against the committed OpenAPI document.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { IncomingMessage } from "node:http";
import { Readable } from "node:stream";
import { promisify } from "node:util";
import { WebSocket } from "ws";
import type { AuditRecord } from "../../src/audit/audit-log.js";
import { rawRequest, readAll } from "../helpers/http.js";
import type { Endpoint } from "../helpers/http.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { contractValidator } from "../helpers/contract.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { count, parseMetrics, value } from "../helpers/prometheus.js";
import { freePort } from "../helpers/port.js";
import { steps } from "../helpers/steps.js";
import { selfSignedCert } from "../helpers/tls.js";
import { until } from "../helpers/fake-sandboxes.js";

const run = promisify(execFile);
const ADMIN = "Qm4-tZ8_vX2pLr7wKb9nYc3dHf6jGs1eA";
const TAG = "acc";
const { step, failed } = steps();

let d: TestDaemon;
let certDir = "";
let cert: Buffer;
let base = "";
let alice = "";
let bob = "";
let sandbox = "";
/** Every mutating call this test makes: who, what, and the status it got. */
const expected: Array<[string, string, number]> = [];

const ep = (token?: string): Endpoint => ({ url: base, ca: cert, ...(token ? { token } : {}) });

/** A JSON call whose reply is checked against the contract; mutating ones are remembered for the audit check. */
async function call<T = Record<string, unknown>>(
  who: string,
  token: string | undefined,
  method: string,
  path: string,
  action: string,
  body?: unknown,
): Promise<{ status: number; body: T; error?: { code: string; message: string } }> {
  const res = await rawRequest(
    ep(token),
    method,
    path,
    body === undefined ? undefined : JSON.stringify(body),
    900_000,
    body === undefined ? {} : { "content-type": "application/json" },
  );
  const status = res.statusCode ?? 0;
  const parsed = JSON.parse((await readAll(res)).toString("utf8")) as T & {
    error?: { code: string; message: string };
  };
  (await contractValidator()).check(method, path, status, parsed);
  if (method !== "GET") expected.push([who, `${method} ${action}`, status]);
  return { status, body: parsed, ...(parsed.error ? { error: parsed.error } : {}) };
}

async function scrape(token = ADMIN): Promise<string> {
  const res = await rawRequest(ep(token), "GET", "/metrics", undefined, 60_000);
  const text = (await readAll(res)).toString("utf8");
  assert.equal(res.statusCode, 200, text);
  return text;
}

before(async () => {
  certDir = await mkdtemp(join(tmpdir(), "forkd-tls-"));
  cert = (await selfSignedCert(certDir)).pem;
  const port = await freePort();
  base = `https://127.0.0.1:${port}`;
  d = await makeDaemon({
    FORKD_LISTEN: `127.0.0.1:${port}`,
    FORKD_TLS_CERT: join(certDir, "cert.pem"),
    FORKD_TLS_KEY: join(certDir, "key.pem"),
    FORKD_TOKEN: ADMIN,
    FORKD_POOL_SIZE: "0",
    FORKD_RATE_RPS: "20",
    FORKD_RATE_BURST: "40",
    FORKD_MAX_UPLOAD_BYTES: String(64 << 10),
  });
});

after(async () => {
  await d.destroy(failed());
  await rm(certDir, { recursive: true, force: true });
});

step("tokens are made with the CLI over the socket; TLS is served; no or a wrong token is 401", async () => {
  for (const tenant of ["alice", "bob"]) {
    const r = await cli(d, ["token", "create", "--tenant", tenant, "--max-sandboxes", "4"]);
    assert.equal(r.code, 0, r.stderr);
    const token = r.stdout.trim();
    assert.match(token, /^fkd_[A-Za-z0-9_-]{43}$/);
    if (tenant === "alice") alice = token;
    else bob = token;
    expected.push(["local", "POST /v1/tokens", 201]);
  }
  const ls = await cli(d, ["token", "ls", "--json"]);
  const listed = JSON.parse(ls.stdout) as { tenant: string; max_sandboxes: number }[];
  assert.deepEqual(
    listed.map((t) => [t.tenant, t.max_sandboxes]),
    [
      ["alice", 4],
      ["bob", 4],
    ],
  );
  assert.ok(!ls.stdout.includes(alice) && !ls.stdout.includes(bob));

  assert.equal((await call("admin", ADMIN, "GET", "/v1/version", "")).status, 200);
  await assert.rejects(rawRequest({ url: base }, "GET", "/v1/version"), /self.signed|certificate/i);
  await assert.rejects(
    rawRequest({ url: base.replace("https:", "http:") }, "GET", "/v1/health", undefined, 5_000),
  );
  const none = await call("anonymous", undefined, "GET", "/v1/sandboxes", "");
  assert.equal(none.status, 401);
  assert.equal(none.error?.code, "unauthenticated");
  const wrong = await call("anonymous", alice + "x", "POST", "/v1/sandboxes", "/v1/sandboxes", {
    snapshot_tag: TAG,
  });
  assert.equal(wrong.status, 401);
  assert.equal((await call("alice", alice, "GET", "/metrics", "")).status, 403);
});

step("a tenant's sandbox is invisible to another tenant: 404 exactly like a missing one", async () => {
  const made = await call("admin", ADMIN, "POST", "/v1/snapshots", "/v1/snapshots", {
    tag: TAG,
    memory_mib: 256,
  });
  assert.equal(made.status, 201, made.error?.message);
  const before = await parseMetrics(await scrape());
  const forked = await call<{ sandboxes: { id: string; owner: string | null }[] }>(
    "alice",
    alice,
    "POST",
    "/v1/sandboxes",
    "/v1/sandboxes",
    { snapshot_tag: TAG, n: 1 },
  );
  assert.equal(forked.status, 201, forked.error?.message);
  const [sb] = forked.body.sandboxes;
  assert.ok(sb);
  assert.equal(sb.owner, "alice");
  sandbox = sb.id;

  const after = await parseMetrics(await scrape());
  assert.equal(
    value(after, "forkd_sandboxes", { state: "running" }),
    value(before, "forkd_sandboxes", { state: "running" }) + 1,
  );
  assert.equal(count(after, "forkd_fork_seconds"), count(before, "forkd_fork_seconds") + 1);

  const ghost = "sb-aaaaaaaaaaaaaaaa";
  const probes: Array<[string, string, string, unknown]> = [
    ["GET", "", "", undefined],
    ["POST", "/exec", "/exec", { cmd: "id" }],
    ["GET", "/files/list?path=/", "/files/list", undefined],
    ["DELETE", "", "", undefined],
  ];
  for (const [method, suffix, action, body] of probes) {
    const theirs = await call(
      "bob",
      bob,
      method,
      `/v1/sandboxes/${sandbox}${suffix}`,
      `/v1/sandboxes/{id}${action}`,
      body,
    );
    const missing = await call(
      "bob",
      bob,
      method,
      `/v1/sandboxes/${ghost}${suffix}`,
      `/v1/sandboxes/{id}${action}`,
      body,
    );
    assert.equal(theirs.status, 404, `${method} ${suffix}`);
    assert.equal(missing.status, 404);
    assert.equal(theirs.error?.message.replace(sandbox, ghost), missing.error?.message);
  }
  const bobs = await call<{ sandboxes: unknown[] }>("bob", bob, "GET", "/v1/sandboxes", "");
  assert.deepEqual(bobs.body.sandboxes, []);
  const alices = await call<{ sandboxes: { id: string }[] }>("alice", alice, "GET", "/v1/sandboxes", "");
  assert.deepEqual(
    alices.body.sandboxes.map((s) => s.id),
    [sandbox],
  );
  const ran = await call<{ stdout: string }>(
    "alice",
    alice,
    "POST",
    `/v1/sandboxes/${sandbox}/exec`,
    "/v1/sandboxes/{id}/exec",
    {
      cmd: "echo mine",
    },
  );
  assert.equal(ran.body.stdout, "mine\n");
});

step("both SDKs work over HTTPS with a tenant token and see only that tenant's sandboxes", async () => {
  const env = {
    ...process.env,
    NODE_EXTRA_CA_CERTS: join(certDir, "cert.pem"),
    SSL_CERT_FILE: join(certDir, "cert.pem"),
  };
  const ts = `
    const { Sandbox, NotFoundError } = await import("@forkd/sdk");
    const [url, alice, bob, id] = process.argv.slice(1);
    const mine = await Sandbox.connect(id, { url, token: alice });
    if ((await mine.getInfo()).state !== "running") throw new Error("not running");
    try { await Sandbox.connect(id, { url, token: bob }); throw new Error("bob saw it"); }
    catch (e) { if (!(e instanceof NotFoundError)) throw e; }
    console.log("ok");
  `;
  const t = await run(process.execPath, ["--input-type=module", "-e", ts, base, alice, bob, sandbox], {
    env,
    cwd: REPO_DIR,
  });
  assert.equal(t.stdout.trim(), "ok");
  const py = `
import sys
sys.path.insert(0, sys.argv[1])
import forkd
url, alice, bob, sid = sys.argv[2:6]
assert forkd.Sandbox.connect(sid, url=url, token=alice).sandbox_id == sid
try:
    forkd.Sandbox.connect(sid, url=url, token=bob)
    raise SystemExit("bob saw it")
except forkd.NotFoundError:
    pass
print("ok")
`;
  const p = await run(
    "python3",
    ["-c", py, join(REPO_DIR, "sdk", "python", "src"), base, alice, bob, sandbox],
    { env },
  );
  assert.equal(p.stdout.trim(), "ok");
});

step("oversized bodies are 413: JSON, and an upload with or without a declared length", async () => {
  // 1.5 MiB against the 1 MiB bound of ordinary JSON bodies.
  const big = await call("alice", alice, "POST", "/v1/sandboxes", "/v1/sandboxes", {
    snapshot_tag: TAG,
    metadata: { note: "x".repeat(1536 << 10) },
  });
  assert.equal(big.status, 413);
  assert.equal(big.error?.code, "payload_too_large");

  const upload = async (body: Buffer | Readable, headers: Record<string, string>) => {
    const res = await rawRequest(
      ep(alice),
      "PUT",
      `/v1/sandboxes/${sandbox}/files?path=/tmp/big`,
      body,
      60_000,
      {
        "content-type": "application/octet-stream",
        ...headers,
      },
    );
    const text = (await readAll(res)).toString("utf8");
    expected.push(["alice", "PUT /v1/sandboxes/{id}/files", res.statusCode ?? 0]);
    return { status: res.statusCode, body: JSON.parse(text) as { error?: { code: string } } };
  };
  const declared = await upload(Buffer.alloc(100 << 10, 7), { "content-length": String(100 << 10) });
  assert.equal(declared.status, 413);
  const chunked = await upload(
    Readable.from(
      (function* () {
        for (let i = 0; i < 10; i++) yield Buffer.alloc(10 << 10, 7);
      })(),
    ),
    { "transfer-encoding": "chunked" },
  );
  assert.equal(chunked.status, 413);
  assert.equal(chunked.body.error?.code, "payload_too_large");
  const ok = await upload(Buffer.alloc(1000, 7), { "content-length": "1000" });
  assert.equal(ok.status, 201);
  const st = await call<{ size: number }>(
    "alice",
    alice,
    "GET",
    `/v1/sandboxes/${sandbox}/files/stat?path=/tmp/big`,
    "",
  );
  assert.equal(st.body.size, 1000, "the refused uploads replaced nothing");
});

step("a burst past the caller's rate is 429 with Retry-After; the admin is not slowed", async () => {
  await new Promise((r) => setTimeout(r, 2500)); // the bucket refills to its burst (40)
  const statuses = await Promise.all(
    Array.from({ length: 100 }, async () => {
      const res = await rawRequest(ep(bob), "GET", "/v1/version", undefined, 30_000);
      await readAll(res);
      if (res.statusCode === 429) assert.ok(Number(res.headers["retry-after"]) >= 1);
      return res.statusCode;
    }),
  );
  // The burst (40) passes, then about 20/s while the requests arrive; the rest is refused.
  const limited = statuses.filter((s) => s === 429).length;
  assert.ok(limited >= 1 && limited <= 60, `429s: ${limited}`);
  assert.equal(statuses.filter((s) => s === 200).length, 100 - limited);
  assert.equal((await call("admin", ADMIN, "GET", "/v1/version", "")).status, 200);
});

step("/metrics: parses, counts the exec, the failures by reason and the memory shared", async () => {
  const m = await parseMetrics(await scrape());
  assert.ok(count(m, "forkd_exec_seconds") >= 1);
  assert.ok(value(m, "forkd_failures_total", { op: "getSandbox", reason: "not_found" }) >= 2);
  assert.ok(value(m, "forkd_failures_total", { op: "createSandboxes", reason: "payload_too_large" }) >= 1);
  const rss = value(m, "forkd_vmm_rss_bytes");
  assert.ok(rss > 0, "the running VMM's memory is sampled");
  assert.ok(value(m, "forkd_vmm_pss_bytes") <= rss);
  assert.equal(value(m, "forkd_memory_saved_bytes"), rss - value(m, "forkd_vmm_pss_bytes"));
  assert.equal(value(m, "forkd_snapshots", { status: "ready" }), 1);
  assert.ok(
    count(m, "forkd_http_request_duration_seconds", {
      route: "/v1/sandboxes",
      method: "POST",
      code: "201",
    }) >= 1,
  );
});

/** A streamed reply read as it comes: its text so far, and whether it ended. */
function reading(res: IncomingMessage): { res: IncomingMessage; text: () => string; ended: () => boolean } {
  let text = "";
  let ended = false;
  res.setEncoding("utf8");
  res.on("data", (s: string) => (text += s));
  res.on("end", () => (ended = true));
  res.on("error", () => (ended = true));
  return { res, text: () => text, ended: () => ended };
}

step(
  "revoking a token ends what it opened at once, with the reason: events, an exec stream, a terminal",
  async () => {
    const made = await call<{ token: string; info: { id: string } }>(
      "admin",
      ADMIN,
      "POST",
      "/v1/tokens",
      "/v1/tokens",
      { tenant: "alice", scope: "tenant" },
    );
    assert.equal(made.status, 201);
    const carol = made.body.token;
    const open = async (token: string, method: string, path: string, body?: unknown) => {
      const res = await rawRequest(
        ep(token),
        method,
        path,
        body === undefined ? undefined : JSON.stringify(body),
        0,
        body === undefined ? {} : { "content-type": "application/json" },
      );
      assert.equal(res.statusCode, 200);
      return reading(res);
    };
    const events = await open(carol, "GET", "/v1/events");
    const others = await open(alice, "GET", "/v1/events"); // another token of the same tenant
    const exec = await open(carol, "POST", `/v1/sandboxes/${sandbox}/exec/stream`, { cmd: "sleep 600" });
    expected.push(["alice", "POST /v1/sandboxes/{id}/exec/stream", 200]);
    const ws = new WebSocket(`${base.replace("https:", "wss:")}/v1/sandboxes/${sandbox}/terminal`, {
      ca: cert,
      headers: { authorization: `Bearer ${carol}` },
    });
    expected.push(["alice", "GET /v1/sandboxes/{id}/terminal", 200]);
    const frames: Record<string, unknown>[] = [];
    let out = "";
    ws.on("message", (m: Buffer, binary) => {
      if (binary) out += m.toString("utf8");
      else frames.push(JSON.parse(m.toString("utf8")) as Record<string, unknown>);
    });
    const closed = new Promise<{ code: number; reason: string }>((r) =>
      ws.on("close", (code, reason) => r({ code, reason: reason.toString("utf8") })),
    );
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("error", reject);
    });
    ws.send(Buffer.from("echo term-$((6*7))\n"), { binary: true });
    await until("the terminal's shell", () => out.includes("term-42"), 120_000);
    await until("the exec's start", () => exec.text().includes('"started"'), 120_000);
    await until("the events' state", () => events.text().includes("event: state"), 60_000);
    await until("the other events' state", () => others.text().includes("event: state"), 60_000);
    const commands = async () =>
      (
        await call<{ commands: { cmd: string }[] }>(
          "alice",
          alice,
          "GET",
          `/v1/sandboxes/${sandbox}/commands`,
          "",
        )
      ).body.commands.map((c) => c.cmd);
    assert.ok((await commands()).includes("sleep 600"));

    const revoked = await call(
      "admin",
      ADMIN,
      "DELETE",
      `/v1/tokens/${made.body.info.id}`,
      "/v1/tokens/{token_id}",
    );
    assert.equal(revoked.status, 200);
    // Each ends by itself, without any read or write of the client's (the bound only guards a hang).
    await until("the event stream's end", () => events.ended(), 30_000);
    await until("the exec stream's end", () => exec.ended(), 30_000);
    const close = await closed;

    const lastEvent = events.text().trimEnd().split("\n\n").at(-1) ?? "";
    assert.match(lastEvent, /^event: error\ndata: /);
    const sse = JSON.parse(lastEvent.split("data: ")[1] ?? "{}") as {
      error: { code: string; details: { reason: string } };
    };
    assert.equal(sse.error.code, "unauthenticated");
    assert.equal(sse.error.details.reason, "token_revoked");
    const last = JSON.parse(exec.text().trimEnd().split("\n").at(-1) ?? "{}") as {
      type: string;
      error: { code: string; message: string };
    };
    assert.equal(last.type, "error");
    assert.equal(last.error.code, "unauthenticated");
    assert.match(last.error.message, /was revoked/);
    assert.equal(close.code, 1008);
    assert.match(close.reason, /revoked/);
    const frame = frames.at(-1) as { type?: string; error?: { code: string } } | undefined;
    assert.equal(frame?.type, "error");
    assert.equal(frame.error?.code, "unauthenticated");
    // What they ran does not outlive them; another token's stream goes on.
    for (let i = 0; (await commands()).includes("sleep 600"); i++) {
      assert.ok(i < 100, "the exec's command was not killed");
      await new Promise((r) => setTimeout(r, 500)); // within the caller's rate
    }
    const seen = others.text().length;
    await until("the other stream's next event", () => others.text().length > seen, 30_000);
    assert.equal(others.ended(), false);
    others.res.destroy();
    assert.equal((await call("anonymous", carol, "GET", "/v1/sandboxes", "")).status, 401);
  },
);

step("every mutating call made here has one audit line with its caller, action and status", async () => {
  const killed = await call("alice", alice, "DELETE", `/v1/sandboxes/${sandbox}`, "/v1/sandboxes/{id}");
  assert.equal(killed.status, 200);
  const path = join(d.dataDir, "audit", "audit.jsonl");
  const key = (x: [string, string, number]) => x.join(" ");
  const want = expected.map(key).sort();
  let got: string[] = [];
  let lines: AuditRecord[] = [];
  for (let i = 0; i < 50; i++) {
    lines = (await readFile(path, "utf8"))
      .split("\n")
      .filter(Boolean)
      .map((l) => JSON.parse(l) as AuditRecord);
    got = lines.map((a) => key([a.caller, a.action, a.status])).sort();
    if (got.length >= want.length) break;
    await new Promise((r) => setTimeout(r, 100)); // written one fsync after each call
  }
  assert.deepEqual(got, want);
  const fork = lines.find((a) => a.action === "POST /v1/sandboxes" && a.caller === "alice");
  assert.deepEqual(fork?.target, { snapshot: TAG, sandboxes: [sandbox] });
  assert.equal(fork?.result, "ok");
  assert.equal(fork?.remote, "127.0.0.1");
  assert.match(fork?.token ?? "", /^tok-/);
  const refused = lines.find((a) => a.caller === "bob" && a.action === "DELETE /v1/sandboxes/{id}");
  assert.equal(refused?.result, "not_found");
  const raw = await readFile(path, "utf8");
  for (const secret of [ADMIN, alice, bob, "echo mine"])
    assert.ok(!raw.includes(secret), "no secret or body logged");
});
