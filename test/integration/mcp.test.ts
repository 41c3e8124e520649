/**
 * The MCP server driven by a real MCP client (the official SDK's), over stdio and over
 * streamable HTTP, against a real daemon and real VMs.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { steps } from "../helpers/steps.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";

const MAIN = join(REPO_DIR, "mcp", "dist", "main.js");
const TOOLS = [
  "branch_sandbox",
  "create_snapshot",
  "expose_port",
  "get_sandbox",
  "kill_sandbox",
  "list_sandboxes",
  "list_snapshots",
  "read_file",
  "run_code",
  "run_command",
  "spawn_sandboxes",
  "wait_for_text",
  "write_file",
];

let d: TestDaemon;
let client: Client;
let http: ChildProcess | null = null;
const { step, failed } = steps();
let ids: string[] = [];

interface ToolResult {
  isError?: boolean;
  content: Array<{ type: string; text?: string; data?: string; mimeType?: string }>;
}

async function call(name: string, args: Record<string, unknown>): Promise<ToolResult> {
  return (await client.callTool({ name, arguments: args }, undefined, { timeout: 900_000 })) as ToolResult;
}

/** The tool's JSON answer (its first text content); fails on a tool error. */
async function ok<T>(name: string, args: Record<string, unknown>): Promise<T> {
  const r = await call(name, args);
  const text = r.content[0]?.text ?? "";
  assert.ok(!r.isError, `${name} failed: ${text}`);
  return JSON.parse(text) as T;
}

before(async () => {
  d = await makeDaemon({ FORKD_POOL_SIZE: "1" });
  client = new Client({ name: "forkd-test", version: "1" });
  await client.connect(
    new StdioClientTransport({
      command: process.execPath,
      args: [MAIN],
      env: { ...(process.env as Record<string, string>), FORKD_SOCKET: d.ep.socket ?? "", FORKD_URL: "" },
      stderr: "inherit",
    }),
  );
});

after(async () => {
  await client.close().catch(() => undefined);
  http?.kill();
  await d.destroy(failed());
});

step("lists its tools with input schemas", async () => {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), TOOLS);
  for (const t of tools) {
    assert.equal(t.inputSchema.type, "object", t.name);
    assert.ok(t.description && t.description.length > 20, `${t.name} needs a description`);
  }
  const run = tools.find((t) => t.name === "run_command");
  assert.deepEqual(Object.keys(run?.inputSchema.properties ?? {}).sort(), [
    "background",
    "command",
    "cwd",
    "env",
    "sandbox_id",
    "timeout_ms",
  ]);
  assert.deepEqual(run?.inputSchema.required?.sort(), ["command", "sandbox_id"]);
});

step("creates a snapshot and forks sandboxes from it", async () => {
  const snap = await ok<{ tag: string; source: unknown; timings: { boot_ms: number } }>("create_snapshot", {
    tag: "mcp",
    memory_mib: 384,
    warm_eval: "base = 40",
  });
  assert.equal(snap.tag, "mcp");
  assert.deepEqual(snap.source, { kind: "template", name: "python" });
  assert.ok(snap.timings.boot_ms > 0, "the snapshot's timings are snake_case");
  const listed = await ok<
    Array<{ tag: string; memory_mib: number; warm_eval: string; warm_eval_language: string; source: unknown }>
  >("list_snapshots", {});
  assert.deepEqual(
    listed.map((s) => [s.tag, s.memory_mib, s.warm_eval, s.warm_eval_language, s.source]),
    [["mcp", 384, "base = 40", "python", { kind: "template", name: "python" }]],
  );
  ids = (await ok<{ sandbox_ids: string[] }>("spawn_sandboxes", { snapshot: "mcp", n: 2 })).sandbox_ids;
  assert.equal(ids.length, 2);
  const all = await ok<Array<{ sandbox_id: string; state: string }>>("list_sandboxes", {});
  assert.deepEqual(all.map((s) => s.sandbox_id).sort(), [...ids].sort());
  const one = await ok<{ sandbox_id: string; state: string; timings: { total_ms: number } }>("get_sandbox", {
    sandbox_id: ids[0],
  });
  assert.equal(one.sandbox_id, ids[0]);
  assert.equal(one.state, "running");
  assert.ok(one.timings.total_ms > 0);
});

step("runs commands: output, a failing exit code, a timeout", async () => {
  const r = await ok<{ exit_code: number; stdout: string }>("run_command", {
    sandbox_id: ids[0],
    command: "echo hi && uname -s",
  });
  assert.deepEqual(r, { exit_code: 0, stdout: "hi\nLinux\n", stderr: "" });
  const bad = await ok<{ exit_code: number; stderr: string }>("run_command", {
    sandbox_id: ids[0],
    command: "echo oops >&2; exit 3",
  });
  assert.equal(bad.exit_code, 3);
  assert.equal(bad.stderr, "oops\n");
  const slow = await ok<{ exit_code: number; error: string }>("run_command", {
    sandbox_id: ids[0],
    command: "sleep 30",
    timeout_ms: 500,
  });
  assert.equal(slow.error, "timed out");
});

step("runs code: inherited globals, values, tracebacks as tool errors", async () => {
  const r = await call("run_code", { sandbox_id: ids[1], code: "base + 2" });
  assert.ok(!r.isError);
  assert.equal((JSON.parse(r.content[0]?.text ?? "{}") as { result: string }).result, "42");
  const e = await call("run_code", { sandbox_id: ids[1], code: "undefined_name" });
  assert.equal(e.isError, true);
  assert.match(e.content[0]?.text ?? "", /NameError/);
});

step("branches a sandbox and forks the branch: the children start from its state", async () => {
  await ok("run_code", { sandbox_id: ids[1], code: "plan = ['a', 'b']" });
  const b = await ok<{ tag: string; status: string }>("branch_sandbox", {
    sandbox_id: ids[1],
    tag: "mcp-step",
  });
  assert.deepEqual([b.tag, b.status], ["mcp-step", "ready"]);
  const kids = (await ok<{ sandbox_ids: string[] }>("spawn_sandboxes", { snapshot: "mcp-step", n: 2 }))
    .sandbox_ids;
  for (const k of kids) {
    const r = await call("run_code", { sandbox_id: k, code: "len(plan)" });
    assert.equal((JSON.parse(r.content[0]?.text ?? "{}") as { result: string }).result, "2");
    await ok("kill_sandbox", { sandbox_id: k });
  }
});

step("writes and reads files, text and binary", async () => {
  await ok("write_file", { sandbox_id: ids[0], path: "/root/a/b.txt", content: "grüße" });
  const t = await ok<{ content: string; encoding: string }>("read_file", {
    sandbox_id: ids[0],
    path: "/root/a/b.txt",
  });
  assert.deepEqual([t.content, t.encoding], ["grüße", "utf8"]);
  const bin = Buffer.from([0, 255, 254, 1, 128]);
  await ok("write_file", {
    sandbox_id: ids[0],
    path: "/root/b.bin",
    content: bin.toString("base64"),
    encoding: "base64",
  });
  const b = await ok<{ content: string; encoding: string; size: number }>("read_file", {
    sandbox_id: ids[0],
    path: "/root/b.bin",
  });
  assert.equal(b.encoding, "base64");
  assert.deepEqual(Buffer.from(b.content, "base64"), bin);
});

step("waits for text in a file and in a command's output; a timeout is a tool error", async () => {
  await ok("run_command", {
    sandbox_id: ids[0],
    command: "(sleep 2; echo server ready > /tmp/flag) >/dev/null 2>&1 &",
    background: false,
  });
  const f = await ok<{ found: boolean; checks: number }>("wait_for_text", {
    sandbox_id: ids[0],
    path: "/tmp/flag",
    text: "ready",
    timeout_ms: 60_000,
  });
  assert.equal(f.found, true);
  const c = await ok<{ found: boolean }>("wait_for_text", {
    sandbox_id: ids[0],
    command: "cat /tmp/flag",
    text: "server",
    timeout_ms: 30_000,
  });
  assert.equal(c.found, true);
  const never = await call("wait_for_text", {
    sandbox_id: ids[0],
    path: "/tmp/flag",
    text: "never",
    timeout_ms: 1_500,
    interval_ms: 250,
  });
  assert.equal(never.isError, true);
  assert.match(never.content[0]?.text ?? "", /did not appear/);
});

step("failures are readable tool errors, not crashes", async () => {
  const r = await call("run_command", { sandbox_id: "sb-aaaaaaaaaaaaaaaa", command: "true" });
  assert.equal(r.isError, true);
  assert.match(r.content[0]?.text ?? "", /not_found/);
  const bad = await call("spawn_sandboxes", { snapshot: "../../etc", n: 1 });
  assert.equal(bad.isError, true);
  assert.match(bad.content[0]?.text ?? "", /invalid_argument/);
  // A port of a sandbox without a network: the error says what it needs.
  const [quiet] = (await ok<{ sandbox_ids: string[] }>("spawn_sandboxes", { snapshot: "mcp", n: 1 }))
    .sandbox_ids;
  const noNet = await call("expose_port", { sandbox_id: quiet ?? "", port: 8000 });
  assert.equal(noNet.isError, true);
  assert.match(noNet.content[0]?.text ?? "", /has no network/);
  await ok("kill_sandbox", { sandbox_id: quiet ?? "" });
  // The server is still serving.
  assert.equal((await client.listTools()).tools.length, TOOLS.length);
});

step("serves the same tools over streamable HTTP", async () => {
  http = spawn(process.execPath, [MAIN, "--http", "0"], {
    env: { ...process.env, FORKD_SOCKET: d.ep.socket, FORKD_URL: "" },
    stdio: ["ignore", "ignore", "pipe"],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let err = "";
    http?.stderr?.on("data", (c: Buffer) => {
      err += c.toString();
      const m = /(http:\/\/\S+\/mcp)/.exec(err);
      if (m?.[1]) resolve(m[1]);
    });
    http?.once("exit", () => reject(new Error(`forkd-mcp --http exited: ${err}`)));
  });
  const c2 = new Client({ name: "forkd-test-http", version: "1" });
  await c2.connect(new StreamableHTTPClientTransport(new URL(url)));
  try {
    assert.deepEqual((await c2.listTools()).tools.map((t) => t.name).sort(), TOOLS);
    const r = (await c2.callTool({
      name: "run_command",
      arguments: { sandbox_id: ids[1], command: "echo via-http" },
    })) as ToolResult;
    assert.match(r.content[0]?.text ?? "", /via-http/);
  } finally {
    await c2.close();
  }
});

step("kills sandboxes", async () => {
  for (const id of ids) assert.deepEqual(await ok("kill_sandbox", { sandbox_id: id }), { killed: true });
  assert.deepEqual(await ok("kill_sandbox", { sandbox_id: ids[0] }), { killed: false });
  assert.deepEqual(await ok("list_sandboxes", {}), []);
});
