/**
 * The guest's JavaScript kernel (guest/evalsrv/forkd_eval.js) on the host, driven over its framed
 * protocol as forkd-agent drives it: notebook semantics, errors, interrupts and bounds.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { copyFile, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";
import { JsKernelProcess } from "../helpers/js-kernel.js";

let k: JsKernelProcess;

before(async () => {
  k = await JsKernelProcess.start();
});

after(async () => {
  await k.close();
});

test("top-level declarations persist between cells and can be declared again", async () => {
  let r = await k.eval("let x = 21; x * 2");
  assert.equal(r.ok, true, JSON.stringify(r));
  assert.equal(r.value, "42");
  r = await k.eval("const x = 5; const { a, b: [c] } = { a: 1, b: [2] }; class K {}");
  assert.equal(r.ok, true, JSON.stringify(r));
  assert.equal(r.value, null);
  r = await k.eval("[x, a, c, typeof K]");
  assert.equal(r.value, "[ 5, 1, 2, 'function' ]");
  // a function defined earlier calls the helper as it is now, as in a notebook
  await k.eval("function helper() { return 1 }\nfunction caller() { return helper() }");
  await k.eval("function helper() { return 2 }");
  assert.equal((await k.eval("caller()")).value, "2");
  await k.eval("var v = 3");
  assert.equal((await k.eval("var v; v")).value, "3", "a bare var keeps the value");
  assert.equal((await k.eval("let u; u")).value, null, "a bare let is undefined: no value");
});

test("top-level await, imports and the last expression's value", async () => {
  let r = await k.eval("const got = await new Promise((res) => setTimeout(() => res(7), 20)); got * 6");
  assert.equal(r.value, "42", JSON.stringify(r));
  r = await k.eval('import { join } from "node:path"; import * as os from "node:os"; join("a", "b")');
  assert.equal(r.value, "'a/b'", JSON.stringify(r));
  assert.equal((await k.eval("typeof os.platform")).value, "'function'");
  assert.equal((await k.eval('(await import("node:path")).sep')).value, "'/'");
  const dir = await mkdtemp(join(tmpdir(), "forkd-jsk-mod-"));
  try {
    await writeFile(join(dir, "mod.mjs"), "export const m = 7; export default 8;");
    await writeFile(join(dir, "d.json"), '{"a": 5}');
    r = await k.eval(
      `import def, { m } from "${dir}/mod.mjs"; import d from "${dir}/d.json" with { type: "json" }; [def, m, d.a]`,
    );
    assert.equal(r.value, "[ 8, 7, 5 ]", JSON.stringify(r.error));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
  assert.equal((await k.eval("{ a: 1 }")).value, "{ a: 1 }", "an object, not a block");
  assert.equal((await k.eval("undefined")).value, null);
  assert.equal((await k.eval("null")).value, "null");
  // a promise as the value is shown, not awaited
  assert.equal((await k.eval("Promise.resolve(1)")).value, "Promise { 1 }");
});

test("console and process.stdout/stderr are captured; fds 0 and 1 are /dev/null", async () => {
  let r = await k.eval(
    "console.log('hi', { a: 1 }); console.info('i'); console.warn('w'); console.error('e'); 1",
  );
  assert.equal(r.stdout, "hi { a: 1 }\ni\n");
  assert.equal(r.stderr, "w\ne\n");
  assert.equal(r.value, "1");
  r = await k.eval("process.stdout.write(Buffer.from([0xff, 0x20, 0x6f, 0x6b])); 2");
  assert.equal(r.stdout, "\ufffd ok");
  // writes to fd 1 itself, and a child's inherited stdout, cannot corrupt the frames
  r = await k.eval(
    "require('fs').writeSync(1, 'junk'); require('child_process').execSync('echo child', { stdio: ['inherit', 'inherit', 'ignore'] });\n" +
      "[0, 1].map((n) => require('fs').readlinkSync('/proc/self/fd/' + n))",
  );
  assert.equal(r.ok, true, JSON.stringify(r));
  assert.equal(r.value, "[ '/dev/null', '/dev/null' ]");
  assert.equal((await k.eval("'still framed'")).value, "'still framed'");
});

test("rich values and display()", async () => {
  let r = await k.eval("class H { _repr_html_() { return '<b>h</b>' } }; new H()");
  assert.equal(r.value, "H {}");
  assert.deepEqual(r.value_data, { "text/html": "<b>h</b>" });
  r = await k.eval("display(new H(), 3); undefined");
  assert.deepEqual(r.display, [{ "text/html": "<b>h</b>", "text/plain": "H {}" }, { "text/plain": "3" }]);
  assert.equal(r.value, null);
  r = await k.eval(
    "({ _repr_png_() { return Buffer.from('png') }, _repr_svg_() { throw new Error('broken') } })",
  );
  assert.deepEqual(r.value_data, { "image/png": Buffer.from("png").toString("base64") });
});

test("errors come back with name, message and a stack without the kernel's frames", async () => {
  let r = await k.eval("function f() { return g() }\nfunction g() { throw new TypeError('bad') }\nf()");
  assert.equal(r.ok, false);
  assert.equal(r.error?.name, "TypeError");
  assert.equal(r.error?.value, "bad");
  const tb = r.error?.traceback ?? "";
  assert.match(tb, /^TypeError: bad\n/);
  assert.match(tb, /at g \(<cell \d+>:2:/);
  assert.match(tb, /at f \(<cell \d+>:1:/);
  assert.doesNotMatch(tb, /forkd_eval|node:vm|processImmediate/);
  r = await k.eval("throw { code: 1 }");
  assert.deepEqual(r.error, { name: "Uncaught", value: "{ code: 1 }", traceback: "Uncaught { code: 1 }" });
  r = await k.eval("let = ;");
  assert.equal(r.error?.name, "SyntaxError");
  assert.match(r.error?.traceback ?? "", /let = ;\n {6}\^/);
  r = await k.eval("process.exit(3)");
  assert.equal(r.error?.name, "ProcessExit");
  assert.equal(r.error?.value, "3");
  assert.equal((await k.eval("x")).value, "5", "the kernel and its globals survive");
});

test("rejections and exceptions nobody handles are reported, not fatal", async () => {
  let r = await k.eval("Promise.reject(new Error('later')); 1");
  assert.equal(r.value, "1");
  assert.match(r.stderr, /^Uncaught \(in promise\) Error: later\n/);
  r = await k.eval(
    "setTimeout(() => { throw new Error('boom') }, 0); await new Promise((res) => setTimeout(res, 30)); 2",
  );
  assert.equal(r.value, "2");
  assert.match(r.stderr, /Uncaught Error: boom/);
  // output made between cells comes with the next reply
  await k.eval("setTimeout(() => console.log('late'), 50); 3");
  await new Promise((res) => setTimeout(res, 200));
  assert.equal((await k.eval("4")).stdout, "late\n");
});

test("SIGINT interrupts a busy loop or an await; the kernel and its globals stay", async () => {
  for (const code of ["while (true) {}", "await new Promise(() => {})"]) {
    k.request(code, 9);
    await new Promise((res) => setTimeout(res, 300));
    k.child.kill("SIGINT");
    const r = await k.next(5_000);
    assert.equal(r.id, 9);
    assert.equal(r.result.ok, false);
    assert.equal(r.result.error?.name, "Interrupted", JSON.stringify(r.result));
    assert.equal((await k.eval("x + 1")).value, "6");
  }
  // a SIGINT that comes while a big cell is still being parsed (slow under TCG) is not lost
  k.request(`let n = 0;\n${"n += 1;\n".repeat(300000)}while (true) {}`, 10);
  await new Promise((res) => setTimeout(res, 20));
  k.child.kill("SIGINT");
  const r = await k.next(5_000);
  assert.equal(r.result.error?.name, "Interrupted", JSON.stringify(r.result));
  assert.equal((await k.eval("x + 2")).value, "7");
  // Between cells: ignored. (The signal is sent before the next cell, and given time to arrive
  // first: a signal still on its way when the next cell starts would interrupt that cell.)
  k.child.kill("SIGINT");
  await new Promise((res) => setTimeout(res, 250));
  assert.equal((await k.eval("x")).value, "5");
});

test("id 0 with no code reseeds and answers an empty result", async () => {
  const before = await k.eval("Math.random()");
  const r = await k.eval("", 0);
  assert.deepEqual(r, {
    ok: true,
    value: null,
    value_data: null,
    display: [],
    stdout: "",
    stderr: "",
    error: null,
  });
  const after = Number((await k.eval("Math.random()")).value);
  assert.ok(after >= 0 && after < 1 && String(after) !== before.value);
});

test("output, values and the whole reply are bounded", async () => {
  let r = await k.eval("console.log('x'.repeat(400 * 1024)); 1");
  assert.equal(r.stdout.length, 256 * 1024 + "\n[output truncated]\n".length);
  assert.ok(r.stdout.endsWith("\n[output truncated]\n"));
  r = await k.eval("({ [Symbol.for('nodejs.util.inspect.custom')]: () => 'z'.repeat(300000) })");
  assert.equal(r.value?.length, 256 * 1024 + "...[truncated]".length);
  // 32 rich outputs of 400K characters each do not fit one frame: the last ones are dropped
  k.request("for (let i = 0; i < 40; i++) display({ _repr_html_: () => String(i).repeat(400000) }); 5", 3);
  const big = await k.next();
  assert.ok(big.bytes <= 1_000_000, `reply of ${big.bytes} bytes`);
  assert.equal(big.result.value, "5");
  assert.ok(big.result.display.length >= 1 && big.result.display.length < 32);
  assert.match(big.result.stderr, /\[a rich output was dropped: reply too large\]/);
  // a big request (about 1 MB of code) is fine too
  const r2 = await k.eval(`let s = 0;\n${"s += 1;\n".repeat(120000)}s`);
  assert.equal(r2.value, "120000", JSON.stringify(r2.error));
});

test("runs as CommonJS from a folder with no package.json, and over socketpairs", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-jsk-cjs-"));
  try {
    await copyFile(join(REPO_DIR, "guest/evalsrv/forkd_eval.js"), join(dir, "forkd_eval.js"));
    await copyFile(join(REPO_DIR, "guest/evalsrv/vendor/acorn.js"), join(dir, "acorn.js"));
    for (const o of [{ script: join(dir, "forkd_eval.js") }, { pipes: false }]) {
      const other = await JsKernelProcess.start(o);
      try {
        assert.equal((await other.eval("let y = await Promise.resolve(2); y + 1")).value, "3", other.stderr);
        assert.equal((await other.eval("y")).value, "2");
      } finally {
        await other.close();
      }
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("the vendored acorn is the pinned devDependency's build", async () => {
  const vendored = await readFile(join(REPO_DIR, "guest/evalsrv/vendor/acorn.js"));
  const pinned = await readFile(join(REPO_DIR, "node_modules/acorn/dist/acorn.js"));
  assert.ok(vendored.equals(pinned), "copy node_modules/acorn/dist/acorn.js to guest/evalsrv/vendor/");
});
