/**
 * The JavaScript kernel in real guests: a snapshot of the `node` template (Debian's nodejs, no
 * Python) warmed with a JavaScript warm_eval, its children running JavaScript cells through the TypeScript SDK (and the CLI and the
 * Python SDK), forked warm (the kernel process started in the parent), diverging after the fork,
 * surviving a timeout, and carrying its globals through a branch. One daemon, one node snapshot.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { Controller, TimeoutError, UnavailableError, fork } from "@forkd/sdk";
import type { RunCodeOpts, Sandbox } from "@forkd/sdk";
import { REPO_DIR } from "../../src/host/paths.js";
import { steps } from "../helpers/steps.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";

let d: TestDaemon;
const { step, failed } = steps();
const TAG = "js-node";
const JS: RunCodeOpts = { language: "javascript", timeoutMs: 60_000 };
let kids: Sandbox[] = [];

before(async () => {
  d = await makeDaemon({ FORKD_POOL_SIZE: "1" });
  process.env.FORKD_SOCKET = d.ep.socket;
  delete process.env.FORKD_URL;
  delete process.env.FORKD_SNAPSHOT;
});

after(async () => {
  await Promise.allSettled(kids.map((k) => k.kill()));
  await d.destroy(failed());
});

step("a snapshot of the node template, warmed with a JavaScript cell", async () => {
  const meta = await new Controller().createSnapshot({
    tag: TAG,
    template: "node",
    memoryMiB: 384,
    // The parent's kernel uses OpenSSL's generator before the freeze (as a warm-up that makes a
    // key, a token or a TLS connection would): its state is then in every child's memory.
    warmEval:
      "const warmed = { answer: 6 * 7, at: await Promise.resolve('parent') }\n" +
      "const warmToken = require('crypto').randomBytes(16).toString('hex')\n" +
      // randomUUID and randomInt also fill Node's own caches of random bytes in the heap
      "require('crypto').randomUUID(); require('crypto').randomInt(10)",
    warmEvalLanguage: "javascript",
  });
  assert.equal(meta.tag, TAG);
  assert.equal(meta.template, "node");
  assert.equal(meta.warm_eval_language, "javascript");
});

step("children run JavaScript cells: globals, await, console, values, errors", async () => {
  kids = await fork(TAG, 2);
  const [a, b] = kids as [Sandbox, Sandbox];
  // the warm_eval's global, defined in the parent's kernel before the freeze
  for (const k of [a, b]) {
    const w = await k.runCode("[warmed.answer, warmed.at]", JS);
    assert.equal(w.error, undefined, w.error?.traceback);
    assert.equal(w.text, "[ 42, 'parent' ]");
  }
  let r = await a.runCode("const r = 3; console.log('radius', r); Math.round(Math.PI * r * r)", JS);
  assert.equal(r.error, undefined, r.error?.traceback);
  assert.equal(r.text, "28");
  assert.deepEqual(r.logs.stdout, ["radius 3\n"]);
  r = await a.runCode("const got = await new Promise((res) => setTimeout(() => res(r * 2), 10)); got", JS);
  assert.equal(r.text, "6");
  r = await a.runCode("function f() { return null.x }\nf()", JS);
  assert.equal(r.error?.name, "TypeError");
  assert.match(r.error?.traceback ?? "", /at f \(<cell \d+>:1:/);
  assert.doesNotMatch(r.error?.traceback ?? "", /forkd_eval/);
  r = await a.runCode("[process.version.startsWith('v'), require('os').hostname() !== '']", JS);
  assert.equal(r.text, "[ true, true ]");
  // no python3 in this image: a clear error, not a hang
  await assert.rejects(a.runCode("1 + 1"), (e: unknown) => {
    assert.ok(e instanceof UnavailableError, String(e));
    assert.match((e as Error).message, /python3/);
    return true;
  });
});

step("the kernel is forked warm: children share the parent's kernel process, then diverge", async () => {
  const origin = await Promise.all(kids.map((k) => k.runCode("performance.timeOrigin", JS)));
  assert.ok(origin[0]?.text, JSON.stringify(origin[0]?.error));
  assert.equal(origin[0]?.text, origin[1]?.text, "one kernel start (in the parent) for both children");
  const rand = await Promise.all(kids.map((k) => k.runCode("Math.random()", JS)));
  assert.notEqual(rand[0]?.text, rand[1]?.text, "Math.random is reseeded after the fork");
  // OpenSSL's generator (crypto.randomBytes, randomUUID, getRandomValues, keys): before
  // forkd-rand.so every child of this snapshot gave the same bytes.
  const cell =
    "const c = require('crypto'); [c.randomBytes(16).toString('hex'), c.randomUUID(), " +
    "Buffer.from(c.webcrypto.getRandomValues(new Uint8Array(16))).toString('hex'), " +
    "c.generateKeyPairSync('ed25519').publicKey.export({ type: 'spki', format: 'der' }).toString('hex'), " +
    "warmToken, process.env.LD_PRELOAD, [1, 2, 3, 4].map(() => c.randomInt(1e9)).join(',')].join(' ')";
  const ssl = await Promise.all(kids.map((k) => k.runCode(cell, JS)));
  const [x, y] = ssl.map((e) => {
    assert.equal(e.error, undefined, e.error?.traceback);
    return (e.text ?? "").replace(/^'|'$/g, "").split(" ");
  }) as [string[], string[]];
  assert.equal(x[4], y[4], "the parent's token is the same in both (it is the parent's memory)");
  for (let i = 0; i < 4; i++) {
    assert.notEqual(x[i], y[i], `OpenSSL output ${i} differs between the children`);
    assert.notEqual(x[i], x[4]);
  }
  assert.match(x[5] ?? "", /^\/\.forkd\/forkd-rand\.so(:|$)/);
  assert.notEqual(x[6], y[6], "randomInt's draws differ between the children");
  await Promise.all(kids.map((k, i) => k.runCode(`let mine = ${i}`, JS)));
  const mine = await Promise.all(kids.map((k) => k.runCode("mine", JS)));
  assert.deepEqual(
    mine.map((e) => e.text),
    ["0", "1"],
  );
});

step("the CLI (eval --language) and the Python SDK (run_code language=) reach the same kernel", async () => {
  const a = kids[1] as Sandbox;
  await a.runCode("let shared = 'from the TypeScript SDK'", JS);
  const r = await cli(d, ["eval", a.sandboxId, "--language", "javascript", "shared.length"]);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, `${"from the TypeScript SDK".length}\n`);
  const bad = await cli(d, ["eval", a.sandboxId, "--language", "javascript", "null.x"]);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /TypeError/);
  const py = [
    "import sys",
    "sys.path.insert(0, sys.argv[1])",
    "import forkd",
    "sb = forkd.Sandbox.connect(sys.argv[2], socket_path=sys.argv[3])",
    "ex = sb.run_code('shared.toUpperCase()', language='javascript')",
    "print(ex.text)",
  ].join("\n");
  const out = await promisify(execFile)("python3", [
    "-c",
    py,
    join(REPO_DIR, "sdk/python/src"),
    a.sandboxId,
    d.ep.socket ?? "",
  ]);
  assert.equal(out.stdout, "'FROM THE TYPESCRIPT SDK'\n");
});

step("a cell past its timeout is interrupted; the kernel keeps its globals", async () => {
  const a = kids[0] as Sandbox;
  await assert.rejects(a.runCode("while (true) {}", { ...JS, timeoutMs: 1_000 }), (e: unknown) => {
    assert.ok(e instanceof TimeoutError, String(e));
    assert.match(e.message, /interrupted, interpreter state kept/, "interrupted, not killed");
    return true;
  });
  const r = await a.runCode("mine + 10", JS);
  assert.equal(r.text, "10", JSON.stringify(r.error));
});

step("branch(): a running sandbox's JavaScript globals fork into new children", async () => {
  const a = kids[0] as Sandbox;
  await a.runCode("const plan = ['explore', 'exploit']", JS);
  const b = await a.branch({ tag: "js-branch" });
  await a.runCode("plan.push('after the branch')", JS);
  const more = await fork(b.tag, 1);
  kids.push(...more);
  assert.equal((await more[0]?.runCode("plan.length", JS))?.text, "2");
  assert.equal((await a.runCode("plan.length", JS)).text, "3");
});
