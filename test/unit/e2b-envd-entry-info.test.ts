/**
 * envd's EntryInfo reader (entry-info.ts): what a hostile guest's find may answer is bounded
 * (small for a Stat, larger for a listing), and its helper commands run with a fixed env, never
 * the sandbox-wide env (AgentClient.defaultEnv) that E2B's envVars set — on the real guest
 * agent run on this host.
 */
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { AgentClient, ExecHandle, ExecHandlers, ExecRequest } from "../../src/agent/client.js";
import { MAX_LIST_OUTPUT, MAX_STAT_OUTPUT, findEntries, statEntry } from "../../src/e2b/envd/entry-info.js";
import { startHostAgent } from "../helpers/agent.js";
import type { HostAgent } from "../helpers/agent.js";

let h: HostAgent;
before(async () => {
  h = await startHostAgent();
});
after(async () => h.close());

/** One find -printf record (type f) of `path`, at `depth`. */
const record = (path: string, depth: number) => `f\0 1\0 644\0root\0root\0 0\0\0${path}\0${depth}\0`;

/** An agent whose find answers `total` bytes of valid records, in 64 KiB chunks. */
function hostileAgent(total: number): { agent: AgentClient; killed: () => boolean } {
  let killed = false;
  const agent = {
    exec(_req: ExecRequest, hs: ExecHandlers = {}): ExecHandle {
      const one = record("/x/" + "y".repeat(100), 1);
      const chunk = Buffer.from(record("/x", 0) + one.repeat(Math.ceil(65536 / one.length)));
      const result = (async () => {
        await new Promise((r) => setImmediate(r));
        for (let sent = 0; sent < total && !killed; sent += chunk.length) {
          await hs.onStdout?.(chunk);
        }
        return { exitCode: killed ? null : 0, signal: killed ? 9 : null, timedOut: false };
      })();
      return {
        started: Promise.resolve({ pid: 1 }),
        result,
        writeStdin: () => undefined,
        closeStdin: () => undefined,
        signal: () => void (killed = true),
        resize: () => undefined,
      };
    },
  } as unknown as AgentClient;
  return { agent, killed: () => killed };
}

test("a Stat's answer is bounded to a few KiB, a listing's to MAX_LIST_OUTPUT, with a clear error", async () => {
  assert.ok(MAX_STAT_OUTPUT <= 64 << 10);
  const stat = hostileAgent(1 << 20);
  await assert.rejects(statEntry(stat.agent, "root", "/x"), /larger than \d+ bytes/);
  assert.equal(stat.killed(), true, "the find is killed past the bound");
  const list = hostileAgent(MAX_LIST_OUTPUT + (1 << 20));
  await assert.rejects(findEntries(list.agent, "root", "/x", 1), /listing \/x is larger than/);
  assert.equal(list.killed(), true);
  const fine = hostileAgent(1 << 20);
  const found = await findEntries(fine.agent, "root", "/x", 1);
  assert.ok(found.length > 1000, "a listing under the bound is read");
});

test("the sandbox-wide env (PATH, LD_PRELOAD) does not reach envd's helper commands", async () => {
  const dir = join(h.dir, "tree");
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, "a.txt"), "hello");
  h.agent.defaultEnv = { PATH: "/nonexistent", LD_PRELOAD: "/nonexistent/evil.so", FROM_SANDBOX: "yes" };
  try {
    const found = await findEntries(h.agent, "root", dir, 1);
    assert.deepEqual(found.map((f) => f.entry.name).sort(), ["a.txt", "tree"]);
    // A user's own command still sees the sandbox-wide env.
    let out = "";
    const r = await h.agent.exec(
      { argv: ["/bin/sh", "-c", 'echo "$FROM_SANDBOX $PATH"'] },
      { onStdout: (d) => void (out += d.toString("utf8")) },
    ).result;
    assert.equal(r.exitCode, 0);
    assert.equal(out.trim(), "yes /nonexistent");
  } finally {
    h.agent.defaultEnv = {};
  }
});
