/**
 * Code contexts, per-cell env, streamed output and interrupts of the warm kernels, through the
 * real guest agent run on the host (its EVAL_OPTS, EVAL_STDOUT/EVAL_STDERR and EVAL_INTERRUPT)
 * and the host's client (src/agent/eval.ts, eval-contexts.ts), for both kernels.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { EvalLanguage } from "../../src/agent/client.js";
import { ForkdError } from "../../src/util/errors.js";
import { startHostAgent } from "../helpers/agent.js";
import type { HostAgent } from "../helpers/agent.js";

let h: HostAgent;

before(async () => {
  h = await startHostAgent({ python: true, node: true });
});

after(async () => {
  await h.close();
});

const CELLS: Record<EvalLanguage, { set: string; get: string; cwd: string; env: string }> = {
  python: {
    set: "only_here = 1",
    get: "only_here",
    cwd: "import os\nos.getcwd()",
    env: "import os\nos.environ.get('CELL_VAR')",
  },
  javascript: {
    set: "var only_here = 1",
    get: "only_here",
    cwd: "process.cwd()",
    env: "process.env.CELL_VAR",
  },
};

for (const language of ["python", "javascript"] as const) {
  const c = CELLS[language];

  test(`${language}: contexts have their own globals, count and cwd; list, restart, delete`, async () => {
    const { agent, dir } = h;
    const [ctx] = await agent.contexts(language, { op: "create", cwd: dir });
    assert.ok(ctx);
    assert.match(ctx.id, /^[0-9a-f]{16}$/);
    assert.equal(ctx.cwd, dir);
    const a = await agent.eval(c.set, 10_000, language, { context: ctx.id });
    assert.equal(a.ok, true, JSON.stringify(a));
    assert.equal(a.context, ctx.id);
    assert.equal(a.execution_count, 1);
    assert.equal((await agent.eval(c.get, 10_000, language, { context: ctx.id })).value, "1");
    const d = await agent.eval(c.get, 10_000, language);
    assert.equal(d.ok, false, "the default context does not see it");
    assert.equal(d.context, "default");
    assert.equal((await agent.eval(c.cwd, 10_000, language, { context: ctx.id })).value, `'${dir}'`);
    const list = await agent.contexts(language, { op: "list" });
    assert.deepEqual(list.map((x) => x.id).sort(), ["default", ctx.id].sort());
    await agent.contexts(language, { op: "restart", context: ctx.id });
    const r = await agent.eval(c.get, 10_000, language, { context: ctx.id });
    assert.equal(r.ok, false, "restarted: its globals are gone");
    assert.equal(r.execution_count, 1);
    await agent.contexts(language, { op: "delete", context: ctx.id });
    await assert.rejects(agent.eval("1", 10_000, language, { context: ctx.id }), (e: unknown) => {
      assert.ok(e instanceof ForkdError);
      assert.equal(e.code, "not_found");
      return true;
    });
    await assert.rejects(agent.contexts(language, { op: "delete", context: "default" }), /cannot be deleted/);
    await assert.rejects(agent.contexts(language, { op: "restart", context: ctx.id }), /no context/);
    await assert.rejects(
      agent.contexts(language, { op: "create", cwd: "/nonexistent/x" }),
      /not a directory/,
    );
  });

  test(`${language}: the number of contexts is bounded`, async () => {
    const made: string[] = [];
    let err: unknown;
    for (let i = 0; i < 40 && !err; i++) {
      try {
        const [x] = await h.agent.contexts(language, { op: "create" });
        made.push(x!.id);
      } catch (e) {
        err = e;
      }
    }
    assert.ok(err instanceof ForkdError && err.code === "resource_exhausted", String(err));
    assert.equal(made.length, 32);
    for (const id of made) await h.agent.contexts(language, { op: "delete", context: id });
  });

  test(`${language}: a cell's env is visible to it and restored after it`, async () => {
    const r = await h.agent.eval(c.env, 10_000, language, { env: { CELL_VAR: "v1" } });
    assert.equal(r.value, "'v1'");
    const after = await h.agent.eval(c.env, 10_000, language);
    assert.ok(
      after.value === null || after.value === "undefined" || after.value === "None",
      String(after.value),
    );
  });

  test(`${language}: output streams while the cell runs`, async () => {
    const flag = join(h.dir, `go-${language}`);
    const code =
      language === "python"
        ? `import os, sys, time\nprint('first', flush=True)\nprint('warn', file=sys.stderr)\nwhile not os.path.exists(${JSON.stringify(flag)}):\n    time.sleep(0.02)\nprint('second')\n7`
        : `const fs = require('fs'); console.log('first'); console.error('warn');\nwhile (!fs.existsSync(${JSON.stringify(flag)})) await new Promise((r) => setTimeout(r, 20));\nconsole.log('second'); 7`;
    const got: string[] = [];
    const r = await h.agent.eval(code, 20_000, language, {
      onOutput: (stream, text) => {
        got.push(`${stream}:${text}`);
        // the cell can only end if its first line reached us while it ran
        if (text.includes("first") && !existsSync(flag)) void writeFile(flag, "");
      },
    });
    assert.equal(r.ok, true, JSON.stringify(r));
    assert.equal(r.value, "7");
    assert.equal(r.stdout, "", "streamed output is not repeated in the reply");
    assert.deepEqual(got.filter((x) => x.startsWith("stdout")).join(""), "stdout:first\nstdout:second\n");
    assert.ok(got.includes("stderr:warn\n"), JSON.stringify(got));
  });

  test(`${language}: large streamed output comes in bounded frames`, async () => {
    const code = language === "python" ? "print('y' * 300000)" : "console.log('y'.repeat(300000))";
    let total = 0;
    let frames = 0;
    await h.agent.eval(code, 20_000, language, {
      onOutput: (_s, text) => {
        total += text.length;
        frames++;
      },
    });
    assert.equal(total, 300001);
    assert.ok(frames >= 300000 / (32 * 1024), `frames: ${frames}`);
  });

  test(`${language}: a cell given up is interrupted (state kept); a waiting one is dropped`, async () => {
    await h.agent.eval(language === "python" ? "kept = 'yes'" : "var kept = 'yes'", 10_000, language);
    const ac = new AbortController();
    const loop = language === "python" ? "while True: pass" : "while (true) {}";
    const first = h.agent.eval(loop, 60_000, language, { signal: ac.signal }).catch((e: unknown) => e);
    const ac2 = new AbortController();
    const second = h.agent.eval("1", 60_000, language, { signal: ac2.signal }).catch((e: unknown) => e);
    ac2.abort();
    const e2 = await second;
    assert.ok(e2 instanceof ForkdError, String(e2));
    assert.match(e2.message, /gave up/);
    ac.abort();
    const e1 = await first;
    assert.ok(e1 instanceof ForkdError && e1.code === "timeout", String(e1));
    assert.equal((await h.agent.eval("kept", 10_000, language)).value, "'yes'");
  });
}
