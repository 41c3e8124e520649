/**
 * E2B's code interpreter (port 49999) against forkd, driven by the unmodified npm
 * `@e2b/code-interpreter` SDK through the daemon's E2B listener (FORKD_E2B_LISTEN, an e2b_ key,
 * E2B_API_URL / E2B_SANDBOX_URL): cells keep state, logs stream while a cell runs (onStdout),
 * errors, a value's text, a matplotlib chart as PNG, contexts, JavaScript, bash, envs (per cell
 * and the sandbox's, from Sandbox.create's envs), an unsupported language, and a client that
 * hangs up mid-stream (the daemon goes on and the next cell runs: the cut cell was interrupted),
 * a cell that prints nothing (its `timeoutMs` holds: the reply is committed at once), a sandbox
 * killed during such a cell (the SDK's "sandbox was killed" error); then forkd's own REST for contexts, context_id/env on eval and eval/stream. One daemon, the
 * E2B-style snapshot (python, user `user`) and a node one.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { NotFoundError, Sandbox, TimeoutError } from "@e2b/code-interpreter";
import { startE2bDaemon } from "../helpers/e2b.js";
import type { E2bDaemon } from "../helpers/e2b.js";
import { apiRequest, rawRequest, readAll } from "../helpers/http.js";
import type { Endpoint } from "../helpers/http.js";
import { steps } from "../helpers/steps.js";

const { step, failed } = steps();
let e: E2bDaemon;
let ep: Endpoint;
let py: Sandbox;
let pyId: string;
let js: Sandbox;
const created: string[] = [];

const api = <T>(method: string, path: string, body?: unknown) =>
  apiRequest<T>(ep, method, path, body, 1_800_000);

async function create(template: string, opts: Parameters<typeof Sandbox.create>[1] = {}): Promise<Sandbox> {
  const sbx = await Sandbox.create(template, { timeoutMs: 900_000, requestTimeoutMs: 300_000, ...opts });
  created.push(sbx.sandboxId);
  return sbx;
}

before(async () => {
  e = await startE2bDaemon();
  Object.assign(process.env, e.env);
  ep = e.daemon.ep;
});

after(async () => {
  await Promise.all(created.map((id) => Sandbox.kill(id).catch(() => undefined)));
  await e?.daemon.destroy(failed());
});

step("the E2B-style snapshot and a node one; a sandbox of each through E2B's SDK", async () => {
  await api("POST", "/v1/snapshots", { tag: "e2bi-node", template: "node" });
  py = await create(e.template, { envs: { SANDBOX_WIDE: "from-create" } });
  pyId = py.sandboxId;
  js = await create("e2bi-node");
});

step("runCode: state across cells, the value's text, the execution count", async () => {
  const a = await py.runCode("x = 20\nx + 1");
  assert.equal(a.error, undefined, a.error?.traceback);
  assert.equal(a.text, "21");
  const b = await py.runCode("x * 2");
  assert.equal(b.text, "40");
  assert.ok(b.executionCount !== undefined && b.executionCount > (a.executionCount ?? 0));
  assert.equal(b.results.length, 1);
  assert.equal(b.results[0]?.isMainResult, true);
});

step("logs: stdout and stderr, and onStdout while the cell still runs", async () => {
  const r = await py.runCode("import sys\nprint('out')\nprint('err', file=sys.stderr)");
  assert.deepEqual(r.logs.stdout, ["out\n"]);
  assert.deepEqual(r.logs.stderr, ["err\n"]);
  // The cell waits for a file the test makes only once it has seen the first line: it can end
  // only if its output streamed while it ran.
  const seen: string[] = [];
  const run = py.runCode(
    "import os, time\nprint('first', flush=True)\nwhile not os.path.exists('/tmp/go'):\n    time.sleep(0.05)\nprint('second')",
    {
      onStdout: (m) => {
        seen.push(m.line);
        if (m.line === "first\n") {
          void api("POST", `/v1/sandboxes/${pyId}/exec`, { cmd: "touch /tmp/go" });
        }
      },
    },
  );
  const done = await run;
  assert.equal(done.error, undefined, done.error?.traceback);
  assert.deepEqual(seen, ["first\n", "second\n"]);
  assert.deepEqual(done.logs.stdout, ["first\n", "second\n"]);
});

step("errors: name, value and traceback", async () => {
  const r = await py.runCode("def f():\n    raise ValueError('bad value')\nf()");
  assert.ok(r.error);
  assert.equal(r.error.name, "ValueError");
  assert.equal(r.error.value, "bad value");
  assert.match(r.error.traceback, /ValueError: bad value/);
  assert.match(r.error.traceback, /in f/);
  let onError = "";
  await py.runCode("1/0", { onError: (e) => void (onError = e.name) });
  assert.equal(onError, "ZeroDivisionError");
});

step("a matplotlib chart comes back as a PNG result", async () => {
  const r = await py.runCode(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title('t')\nplt.show()",
    { timeoutMs: 300_000 },
  );
  assert.equal(r.error, undefined, r.error?.traceback);
  const png = r.results.find((x) => x.png)?.png;
  assert.ok(png, JSON.stringify(r.results.map((x) => x.formats())));
  assert.equal(Buffer.from(png, "base64").subarray(1, 4).toString(), "PNG");
  const html = await py.runCode("class H:\n    def _repr_html_(self): return '<b>h</b>'\nH()");
  assert.equal(html.results[0]?.html, "<b>h</b>");
});

step("contexts: their own globals and cwd; list, restart, delete", async () => {
  await py.runCode("shared = 'default'");
  const c = await py.createCodeContext({ cwd: "/tmp" });
  assert.equal(c.cwd, "/tmp");
  assert.equal(c.language, "python");
  const inCtx = await py.runCode("shared", { context: c });
  assert.equal(inCtx.error?.name, "NameError");
  assert.equal((await py.runCode("import os\nmine = os.getcwd()\nmine", { context: c })).text, "'/tmp'");
  assert.equal((await py.runCode("'mine' in globals()")).text, "False");
  assert.equal((await py.runCode("shared")).text, "'default'");
  const list = await py.listCodeContexts();
  assert.ok(list.some((x) => x.id === c.id));
  await py.restartCodeContext(c);
  assert.equal((await py.runCode("mine", { context: c })).error?.name, "NameError");
  await py.removeCodeContext(c);
  // (a short requestTimeoutMs: the SDK leaves its request timer running when a call fails)
  await assert.rejects(py.runCode("1", { context: c, requestTimeoutMs: 5_000 }), NotFoundError);
  assert.ok(!(await py.listCodeContexts()).some((x) => x.id === c.id));
});

step("envs: a cell's own, over the sandbox's, restored after it", async () => {
  const r = await py.runCode("import os\n(os.environ.get('MY_VAR'), os.environ.get('SANDBOX_WIDE'))", {
    envs: { MY_VAR: "cell" },
  });
  assert.equal(r.text, "('cell', 'from-create')");
  const over = await py.runCode("os.environ['SANDBOX_WIDE']", { envs: { SANDBOX_WIDE: "mine" } });
  assert.equal(over.text, "'mine'");
  assert.equal((await py.runCode("os.environ['SANDBOX_WIDE']")).text, "'from-create'");
  assert.equal((await py.runCode("os.environ.get('MY_VAR')")).text, undefined, "restored: no value");
});

step("language: js runs in the JavaScript kernel, bash as a command, others are an error", async () => {
  const a = await js.runCode("const a = 21; console.log('hello'); a * 2", { language: "js" });
  assert.equal(a.error, undefined, a.error?.traceback);
  assert.equal(a.text, "42");
  assert.deepEqual(a.logs.stdout, ["hello\n"]);
  assert.equal((await js.runCode("a + 1", { language: "javascript" })).text, "22");
  const ctx = await js.createCodeContext({ language: "javascript" });
  assert.equal((await js.runCode("typeof a", { context: ctx })).text, "'undefined'");
  const sh = await py.runCode("echo hi; echo oops >&2; exit 3", { language: "bash" });
  assert.equal(sh.logs.stdout.join(""), "hi\n");
  assert.equal(sh.logs.stderr.join(""), "oops\n");
  assert.equal(sh.error?.name, "CommandExitError");
  await assert.rejects(py.runCode("x", { language: "r", requestTimeoutMs: 5_000 }), /400/);
});

step("a client hanging up mid-stream: the cell is interrupted, the next one runs", async () => {
  const token = (py as unknown as { envdAccessToken?: string }).envdAccessToken;
  const res = await fetch(`${e.env.E2B_SANDBOX_URL}/execute`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "e2b-sandbox-id": pyId,
      "e2b-sandbox-port": "49999",
      ...(token ? { "x-access-token": token } : {}),
    },
    body: JSON.stringify({
      code: "import time\nfor i in range(100000):\n    print(i, flush=True)\n    time.sleep(0.05)\nfinished = True",
    }),
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  const first = (await reader.read()) as { value?: Uint8Array };
  assert.ok(first.value && first.value.length > 0);
  await reader.cancel(); // the connection goes, mid-line or between lines
  const next = await py.runCode("'finished' in globals()");
  assert.equal(next.error, undefined, next.error?.traceback);
  assert.equal(next.text, "False", "the cut cell was interrupted, not left to run");
  assert.equal((await py.runCode("x")).text, "20", "the kernel kept its state");
});

step(
  "a cell that prints nothing: its timeoutMs holds (the SDK's timeout error); the next cell runs",
  async () => {
    await assert.rejects(py.runCode("import time; time.sleep(30)", { timeoutMs: 3_000 }), (err: unknown) => {
      assert.ok(err instanceof TimeoutError, String(err));
      assert.match(err.message, /Execution timed out/, "the cell's own timeout, not the request's");
      return true;
    });
    assert.equal((await py.runCode("x")).text, "20");
  },
);

step("a sandbox killed during a cell that prints nothing: the SDK's 'sandbox was killed' error", async () => {
  const k = await create(e.template);
  const cell = k.runCode("open('/tmp/cell-started', 'w').close()\nimport time\ntime.sleep(600)", {
    timeoutMs: 0,
  });
  cell.catch(() => undefined);
  // Killed once the cell runs (it made its file).
  for (let i = 0; ; i++) {
    const r = await api<{ exit_code: number }>("POST", `/v1/sandboxes/${k.sandboxId}/exec`, {
      cmd: "test -e /tmp/cell-started",
    });
    if (r.exit_code === 0) break;
    assert.ok(i < 1000, "the cell never started");
    await new Promise((res) => setTimeout(res, 200));
  }
  await Sandbox.kill(k.sandboxId);
  await assert.rejects(cell, (err: unknown) => {
    assert.ok(err instanceof TimeoutError, String(err));
    assert.match(err.message, /sandbox was killed/);
    return true;
  });
});

step("forkd's own REST: contexts, context_id and env on eval, and eval/stream", async () => {
  const sb = `/v1/sandboxes/${pyId}`;
  const ctx = await api<{ id: string; language: string; cwd: string }>("POST", `${sb}/contexts`, {
    cwd: "/tmp",
  });
  assert.equal(ctx.language, "python");
  assert.equal(ctx.cwd, "/tmp");
  const a = await api<{ value: string | null; context: string; execution_count: number }>(
    "POST",
    `${sb}/eval`,
    {
      code: "import os\nrest = os.environ['R']\nrest",
      context_id: ctx.id,
      env: { R: "from-rest" },
    },
  );
  assert.equal(a.value, "'from-rest'");
  assert.equal(a.context, ctx.id);
  assert.equal(a.execution_count, 1);
  const d = await api<{ ok: boolean }>("POST", `${sb}/eval`, { code: "rest" });
  assert.equal(d.ok, false, "the default context has no `rest`");
  const { contexts } = await api<{ contexts: { id: string }[] }>("GET", `${sb}/contexts?language=python`);
  assert.deepEqual(contexts.map((c) => c.id).sort(), ["default", ctx.id].sort());
  await api("POST", `${sb}/contexts/${ctx.id}/restart`);
  await api("DELETE", `${sb}/contexts/${ctx.id}`);
  await assert.rejects(
    api("POST", `${sb}/eval`, { code: "1", context_id: ctx.id }),
    /404|not_found|no code context/,
  );
  const raw = await rawRequest(
    ep,
    "POST",
    `${sb}/eval/stream`,
    JSON.stringify({ code: "print('s1')\n5" }),
    600_000,
  );
  const lines = (await readAll(raw))
    .toString()
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as { type: string; text?: string; result?: { value: string } });
  assert.deepEqual(
    lines.map((l) => l.type),
    ["stdout", "result"],
  );
  assert.equal(lines[0]?.text, "s1\n");
  assert.equal(lines[1]?.result?.value, "5");
});
