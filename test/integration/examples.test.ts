/**
 * The documentation's examples run against a real daemon, so they cannot rot: every file under
 * docs/examples (TypeScript and Python) must exit 0 and print what its `expect:` lines say, and
 * the MCP client configuration in docs/mcp.md must start a server that lists its tools.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { checkedRequest } from "../helpers/contract.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";

const EXAMPLES = join(REPO_DIR, "docs", "examples");
let d: TestDaemon;
let failed = false;

before(async () => {
  d = await makeDaemon({ FORKD_POOL_SIZE: "2" });
  await checkedRequest(d.ep, "POST", "/v1/snapshots", { tag: "examples", memory_mib: 384 }, 900_000);
});

after(async () => {
  await d.destroy(failed);
});

function run(cmd: string, file: string, env: NodeJS.ProcessEnv): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    execFile(cmd, [file], { cwd: REPO_DIR, env, timeout: 600_000 }, (err, stdout, stderr) =>
      resolve({ code: err ? (typeof err.code === "number" ? err.code : 1) : 0, out: stdout + stderr }),
    );
  });
}

async function expectations(file: string): Promise<RegExp[]> {
  const src = await readFile(file, "utf8");
  return [...src.matchAll(/^(?:\/\/|#) expect: \/(.+)\/(\w*)$/gm)].map((m) => new RegExp(m[1] ?? "", m[2]));
}

for (const [lang, cmd, ext] of [
  ["typescript", process.execPath, ".mjs"],
  ["python", "python3", ".py"],
] as const) {
  test(`${lang} examples run and print what they promise`, async () => {
    const files = (await readdir(join(EXAMPLES, lang))).filter((f) => f.endsWith(ext)).sort();
    assert.ok(files.length >= 2, `examples under docs/examples/${lang}`);
    const env = {
      ...process.env,
      FORKD_SOCKET: d.ep.socket,
      FORKD_URL: "",
      FORKD_SNAPSHOT: "examples",
      PYTHONPATH: join(REPO_DIR, "sdk", "python", "src"),
    };
    for (const f of files) {
      const path = join(EXAMPLES, lang, f);
      const expects = await expectations(path);
      if (f !== "e2b_quickstart.py") assert.ok(expects.length > 0, `${f} has no expect: lines`);
      const r = await run(cmd, path, env);
      try {
        assert.equal(r.code, 0, `${f} failed:\n${r.out}`);
        for (const re of expects) assert.match(r.out, re, `${f}: output lacks ${re}`);
      } catch (e) {
        failed = true;
        throw e;
      }
    }
  });
}

test("the MCP client configuration in docs/mcp.md starts a working server", async () => {
  const doc = await readFile(join(REPO_DIR, "docs", "mcp.md"), "utf8");
  const block = /```json\n(\{[\s\S]*?"mcpServers"[\s\S]*?\})\n```/.exec(doc)?.[1];
  assert.ok(block, "docs/mcp.md has a JSON block with mcpServers");
  const cfg = JSON.parse(block.replaceAll("/path/to/forkd", REPO_DIR)) as {
    mcpServers: Record<string, { command: string; args?: string[]; env?: Record<string, string> }>;
  };
  const server = cfg.mcpServers.forkd;
  assert.ok(server, "the block configures a server named forkd");
  const client = new Client({ name: "docs-test", version: "1" });
  await client.connect(
    new StdioClientTransport({
      command: server.command === "node" ? process.execPath : server.command,
      args: server.args ?? [],
      env: { ...(process.env as Record<string, string>), ...server.env, FORKD_SOCKET: d.ep.socket ?? "" },
    }),
  );
  try {
    const { tools } = await client.listTools();
    assert.ok(tools.some((t) => t.name === "run_command"));
    const r = (await client.callTool({ name: "list_snapshots", arguments: {} })) as {
      content: Array<{ text?: string }>;
    };
    assert.match(r.content[0]?.text ?? "", /"examples"/);
  } finally {
    await client.close();
  }
});
