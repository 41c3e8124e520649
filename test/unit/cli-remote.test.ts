/**
 * The CLI against a small fake daemon on TCP (FORKD_URL + FORKD_TOKEN; no autostart, no VMs):
 * what it sends for the routes it fronts (rmi's --cascade and --force among them), how it shows
 * a streamed transfer's progress on a pipe, and that Ctrl-C or a hang-up cuts an exec's stream
 * (the daemon sees the client go) and exits 128 + the signal.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { createServer } from "node:http";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import { recordView } from "../../src/gateway/record-view.js";
import { REPO_DIR } from "../../src/host/paths.js";

const CLI = join(REPO_DIR, "dist/src/cli/main.js");
const TOKEN = "t".repeat(40);
const CREATED = "2025-01-01T00:00:00.000Z";

interface Seen {
  method: string;
  url: string;
  auth: string | undefined;
  body: string;
}

let server: Server;
let url = "";
const seen: Seen[] = [];
/** Resolved when a client of the exec stream went away (its connection closed). */
let execGone: (() => void) | null = null;
/** The nodes GET /v1/sandboxes lists its two sandboxes on (null: one daemon). */
let listedOn: [string | null, string | null] = [null, null];

/** A sandbox's REST view (docs/openapi.json's Sandbox), as a gateway makes one from its record. */
const sandboxView = (id: string, node: string | null): Record<string, unknown> => ({
  ...recordView(
    {
      id,
      node: node ?? "n0",
      owner: null,
      tag: "base",
      state: "running",
      reason: null,
      created: CREATED,
      updated: CREATED,
    },
    (k) => k,
  ),
  pid: 42,
  node,
});

function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
}

function route(req: IncomingMessage, res: ServerResponse): void {
  const u = new URL(req.url ?? "/", "http://x");
  if (req.method === "DELETE" && u.pathname.startsWith("/v1/snapshots/")) {
    const tag = decodeURIComponent(u.pathname.slice("/v1/snapshots/".length));
    if (tag === "busy")
      return json(res, 409, {
        error: { code: "conflict", message: "snapshot busy has 1 running sandboxes", details: {} },
      });
    return json(res, 200, {
      deleted: tag,
      ...(u.searchParams.get("cascade") === "1" ? { cascaded: [`${tag}-child`] } : {}),
      ...(u.searchParams.get("force") === "1" ? { orphaned: [`${tag}-child`] } : {}),
    });
  }
  if (req.method === "POST" && u.pathname === "/v1/snapshots/s1/push") {
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    const lines = [
      { type: "progress", message: "staging s1", phase: "stage" },
      {
        type: "progress",
        message: "[1/2] snapshots/s1/memory: uploaded (1.0 MiB)",
        phase: "upload",
        layer: { index: 1, count: 2, path: "snapshots/s1/memory" },
        done_bytes: 1 << 20,
        total_bytes: 3 << 20,
      },
      {
        type: "done",
        result: {
          tag: "s1",
          ref: "reg.example/forkd/s1:v1",
          digest: "sha256:" + "a".repeat(64),
          blobs: { total: 2, uploaded: 1, mounted: 0, skipped: 1 },
          bytes: { uploaded: 1 << 20, skipped: 2 << 20 },
        },
      },
    ];
    for (const l of lines) res.write(JSON.stringify(l) + "\n");
    return void res.end();
  }
  if (req.method === "POST" && u.pathname === "/v1/snapshots") {
    return json(res, 409, {
      error: { code: "conflict", message: "snapshot s2 already exists", details: {} },
    });
  }
  if (req.method === "GET" && u.pathname === "/v1/sandboxes")
    return json(res, 200, {
      sandboxes: [
        sandboxView("sb-aaaaaaaaaaaaaaaa", listedOn[0]),
        sandboxView("sb-bbbbbbbbbbbbbbbb", listedOn[1]),
      ],
      next_token: null,
    });
  if (req.method === "POST" && u.pathname.endsWith("/exec/stream")) {
    res.writeHead(200, { "content-type": "application/x-ndjson" });
    res.write(JSON.stringify({ type: "started", pid: 7 }) + "\n");
    res.write(JSON.stringify({ type: "stdout", data: Buffer.from("working\n").toString("base64") }) + "\n");
    // Never exits: the client has to cut it.
    res.on("close", () => execGone?.());
    return;
  }
  json(res, 404, {
    error: { code: "not_found", message: `no route ${req.method} ${u.pathname}`, details: {} },
  });
}

before(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      seen.push({ method: req.method ?? "", url: req.url ?? "", auth: req.headers.authorization, body });
      route(req, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

const env = () => ({ ...process.env, FORKD_URL: url, FORKD_TOKEN: TOKEN, FORKD_DATA_DIR: "/nonexistent" });

async function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await promisify(execFile)(process.execPath, [CLI, ...args], { env: env() });
    return { code: 0, ...r };
  } catch (e) {
    const x = e as { code: number; stdout: string; stderr: string };
    return { code: x.code, stdout: x.stdout, stderr: x.stderr };
  }
}

test("ls: a NODE column only when a sandbox names its node; --json carries node either way", async () => {
  listedOn = [null, null];
  let r = await cli(["ls"]);
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(r.stdout.split("\n")[0]?.split(/\s+/), ["ID", "PID", "TAG", "STATE", "CREATED"]);
  r = await cli(["ls", "--json"]);
  assert.deepEqual(
    (JSON.parse(r.stdout) as { node: string | null }[]).map((s) => s.node),
    [null, null],
  );
  // In a cluster: each row its node ("-" for one that names none).
  listedOn = ["n2", null];
  r = await cli(["ls"]);
  assert.equal(r.code, 0, r.stderr);
  const rows = r.stdout
    .trimEnd()
    .split("\n")
    .map((l) => l.split(/\s+/));
  assert.deepEqual(rows[0], ["ID", "PID", "TAG", "STATE", "NODE", "CREATED"]);
  assert.deepEqual(
    rows.slice(1).map((c) => [c[0], c[4]]),
    [
      ["sb-aaaaaaaaaaaaaaaa", "n2"],
      ["sb-bbbbbbbbbbbbbbbb", "-"],
    ],
  );
  r = await cli(["ls", "--json"]);
  assert.deepEqual(
    (JSON.parse(r.stdout) as { node: string | null }[]).map((s) => s.node),
    ["n2", null],
  );
});

const deletes = () => seen.filter((s) => s.method === "DELETE").map((s) => s.url);

test("rmi sends ?cascade=1 or ?force=1 (and neither by default), with the token", async () => {
  seen.length = 0;
  let r = await cli(["rmi", "a", "b"]);
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(deletes(), ["/v1/snapshots/a", "/v1/snapshots/b"]);
  assert.ok(seen.every((s) => s.auth === `Bearer ${TOKEN}`));

  seen.length = 0;
  r = await cli(["rmi", "--cascade", "base"]);
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(deletes(), ["/v1/snapshots/base?cascade=1"]);
  assert.match(r.stderr, /deleted base \(with base-child\)/);

  seen.length = 0;
  r = await cli(["rmi", "--force", "base"]);
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(deletes(), ["/v1/snapshots/base?force=1"]);
  assert.match(r.stderr, /base-child flattened/);
});

test("rmi: both flags are a usage error (exit 2, nothing sent); a refusal is the daemon's error (exit 1)", async () => {
  seen.length = 0;
  const both = await cli(["rmi", "--cascade", "--force", "base"]);
  assert.equal(both.code, 2);
  assert.deepEqual(deletes(), []);
  const busy = await cli(["rmi", "busy"]);
  assert.equal(busy.code, 1);
  assert.match(busy.stderr, /snapshot busy has 1 running sandboxes \[conflict\]/);
});

test("commander's own usage errors exit 2 as documented; help and --version exit 0", async () => {
  seen.length = 0;
  for (const args of [["bogus"], ["exec"], ["fork", "--no-such-flag"]]) {
    const r = await cli(args);
    assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
  }
  assert.equal((await cli(["--help"])).code, 0);
  assert.equal((await cli(["--version"])).code, 0);
  assert.deepEqual(seen, [], "a usage error sends nothing");
});

test("push on a pipe: one plain line per progress event (with its bytes), the result on stdout", async () => {
  const r = await cli(["push", "s1", "reg.example/forkd/s1:v1"]);
  assert.equal(r.code, 0, r.stderr);
  const lines = r.stderr.trimEnd().split("\n");
  assert.equal(lines.length, 2, r.stderr);
  assert.match(lines[0] ?? "", /^ {2}\[\d+\.\ds\] staging s1$/);
  assert.match(
    lines[1] ?? "",
    /^ {2}\[\d+\.\ds\] \[1\/2\] snapshots\/s1\/memory: uploaded \(1\.0 MiB\) \[1\.0 of 3\.0 MiB \(33%\)\]$/,
  );
  assert.ok(!r.stderr.includes("\r") && !r.stderr.includes("\u001b["), "no terminal control on a pipe");
  assert.match(
    r.stdout,
    /reg\.example\/forkd\/s1:v1@sha256:a+: 1 of 2 blobs uploaded \(1\.0 MiB\), 1 already there/,
  );
  const push = seen.find((s) => s.url.startsWith("/v1/snapshots/s1/push"));
  assert.equal(push?.url, "/v1/snapshots/s1/push?stream=1");
  assert.deepEqual(JSON.parse(push?.body ?? "{}"), { ref: "reg.example/forkd/s1:v1", insecure: false });
});

test("snapshot --warm-eval-language javascript sends warm_eval_language; python (the default) sends none", async () => {
  const bodies = async (args: string[]) => {
    seen.length = 0;
    const r = await cli(["snapshot", "--tag", "s2", "--template", "node", ...args]);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /snapshot s2 already exists/);
    return seen.filter((x) => x.url.startsWith("/v1/snapshots")).map((x) => JSON.parse(x.body) as object);
  };
  const [js] = await bodies(["--warm-eval", "globalThis.n = 1", "--warm-eval-language", "javascript"]);
  const sent = js as { warm_eval?: string; warm_eval_language?: string } | undefined;
  assert.equal(sent?.warm_eval, "globalThis.n = 1");
  assert.equal(sent?.warm_eval_language, "javascript");
  const [py] = await bodies(["--warm-eval", "n = 1", "--warm-eval-language", "python"]);
  assert.ok(py && !("warm_eval_language" in py), JSON.stringify(py));
  seen.length = 0;
  const bad = await cli(["snapshot", "--tag", "s2", "--warm-eval-language", "ruby", "--warm-eval", "1"]);
  assert.equal(bad.code, 2, bad.stderr);
  const alone = await cli(["snapshot", "--tag", "s2", "--warm-eval-language", "javascript"]);
  assert.equal(alone.code, 2, alone.stderr);
  assert.match(alone.stderr, /--warm-eval-language goes with --warm-eval/);
  assert.deepEqual(seen, [], "a usage error sends nothing");
});

for (const [sig, code] of [
  ["SIGINT", 130],
  ["SIGHUP", 129],
] as const) {
  test(`${sig} during exec cuts its stream (the daemon sees it go) and exits ${code}`, async () => {
    const gone = new Promise<void>((r) => (execGone = r));
    const child = spawn(process.execPath, [CLI, "exec", "sb-aaaaaaaaaaaaaaaa", "--", "sleep", "1000"], {
      env: env(),
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    child.stderr.on("data", (c: Buffer) => (err += c.toString()));
    const exited = new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
    await new Promise<void>((r) =>
      child.stdout.on("data", (c: Buffer) => {
        out += c.toString();
        if (out.includes("working")) r();
      }),
    );
    child.kill(sig);
    assert.equal(await exited, code, err);
    await gone;
    assert.match(err, /interrupted; the command is killed/);
  });
}
