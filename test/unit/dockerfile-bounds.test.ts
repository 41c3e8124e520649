/**
 * The Dockerfile builder's bounds on hostile input (no VM): variable expansion that doubles a
 * value each line is refused with the line instead of exhausting the daemon's memory; the ENV,
 * ARG and LABEL values together are bounded; a .dockerignore or COPY glob that makes a
 * backtracking regular expression exponential matches in polynomial steps, and a malformed one
 * is an invalid_argument.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { parseDockerfile } from "../../src/image/dockerfile/parse.js";
import { EMPTY_CONFIG, VARS_LIMIT, plan } from "../../src/image/dockerfile/plan.js";
import { GLOB_LIMITS, Glob, IgnoreRules } from "../../src/image/dockerfile/ignore.js";
import { WORD_LIMIT, WordError, word } from "../../src/image/dockerfile/words.js";

const planOf = (text: string) => plan(parseDockerfile(text), EMPTY_CONFIG, {});

function refusedAt(f: () => unknown, line: number, re: RegExp): void {
  assert.throws(f, (e: Error & { code?: string; details?: { line?: number } }) => {
    assert.equal(e.code, "invalid_argument", e.message);
    assert.equal(e.details?.line, line, e.message);
    assert.match(e.message, re);
    return true;
  });
}

test("ENV a=$a$a repeated: refused at the line its word passes the limit, not an OOM", () => {
  // 40 doublings would be 2^40 characters; the word limit stops it at 2^17.
  const text = ["FROM scratch", "ENV a=x", ...Array.from({ length: 40 }, () => "ENV a=$a$a")].join("\n");
  // The word `a=` + 'x' doubled n times is 2^n + 2 characters: past WORD_LIMIT (2^16) at n = 16.
  refusedAt(() => planOf(text), 2 + 16, /word grows past/);
  // The same in ARG, LABEL and quoted words.
  const arg = ["FROM scratch", "ARG b=y", ...Array.from({ length: 40 }, () => 'ARG b="$b$b"')].join("\n");
  refusedAt(() => planOf(arg), 2 + 16, /word grows past/);
});

test("words: a word is bounded, expansion included", () => {
  const big = "z".repeat(WORD_LIMIT / 2 + 1);
  assert.equal(word("$v", new Map([["v", big]]), "\\"), big);
  assert.throws(() => word("$v$v", new Map([["v", big]]), "\\"), WordError);
  assert.throws(() => word("'$v'\"$v$v\"", new Map([["v", big]]), "\\"), WordError);
});

test("the ENV, ARG and LABEL values together are bounded, naming the line", () => {
  // Each value under the word limit, together over VARS_LIMIT.
  const n = Math.ceil(VARS_LIMIT / (WORD_LIMIT / 2)) + 1;
  const lines = ["FROM scratch", `ARG h=${"q".repeat(WORD_LIMIT / 4)}`, "ARG h=$h$h"];
  for (let i = 0; i < n; i++) lines.push(`${["ENV", "LABEL"][i % 2]} k${i}=$h`);
  let at = 0;
  assert.throws(
    () => planOf(lines.join("\n")),
    (e: Error & { code?: string; details?: { line?: number } }) => {
      assert.equal(e.code, "invalid_argument", e.message);
      assert.match(e.message, /ENV, ARG and LABEL values together exceed/);
      at = e.details?.line ?? 0;
      return true;
    },
  );
  // The line named is the first over the bound: the lines before it plan.
  assert.ok(at > 3 && at <= lines.length, String(at));
  assert.match(lines[at - 1] ?? "", /^(ENV|LABEL) /);
  assert.ok(planOf(lines.slice(0, at - 1).join("\n")).config.env.length > 0);
  // Replacing a value does not count twice.
  const same = ["FROM scratch", `ARG h=${"q".repeat(WORD_LIMIT / 2)}`];
  for (let i = 0; i < n; i++) same.push("ENV k=$h");
  assert.equal(planOf(same.join("\n")).config.env.length, 1);
});

test("globs: Docker's forms, unchanged", () => {
  const cases: [string, string, boolean][] = [
    ["*.log", "x.log", true],
    ["*.log", "a/x.log", false],
    ["**/*.log", "x.log", true],
    ["**/*.log", "a/b/x.log", true],
    ["a/**", "a/b/c", true],
    ["a/**", "a", false],
    ["a/**/b", "a/b", true],
    ["a/**/b", "a/x/y/b", true],
    ["a/**/b", "a/xb", false],
    ["**", "a/b", true],
    ["x**y", "x/a/y", true],
    ["?.txt", "a.txt", true],
    ["?.txt", "/.txt", false],
    ["?.txt", "ab.txt", false],
    ["[a-c]x", "bx", true],
    ["[a-c]x", "dx", false],
    ["[!a-c]x", "dx", true],
    ["[^a-c]x", "ax", false],
    ["[]a]", "]", true],
    ["a[", "a[", true],
    ["\\*x", "*x", true],
    ["\\*x", "ax", false],
    ["a.b", "axb", false],
    ["(x)+", "(x)+", true],
    ["a/*/c", "a/b/c", true],
    ["a/*/c", "a/b/d/c", false],
    ["*", "", true],
    ["é?", "éü", true],
  ];
  for (const [pat, path, want] of cases) assert.equal(new Glob(pat).test(path), want, `${pat} ~ ${path}`);
});

test("a glob that backtracks exponentially in a regular expression returns at once", () => {
  const hostile = "*a*a*a*a*a*a*a*ab";
  const name = "a".repeat(60);
  const t0 = Date.now();
  assert.equal(new Glob(hostile).test(name), false);
  assert.equal(new Glob(`**/${hostile}`).test(`x/${name}`), false);
  assert.equal(new Glob("**/**/**/**/**/**/**/**/**/z").test(`${"d/".repeat(60)}y`), false);
  const rules = new IgnoreRules(`${hostile}\n**/**/**/**/**/**/**/**/**/*a*a*a*a*a*a*ab\n`);
  assert.equal(rules.ignored(`${"a/".repeat(20)}${name}`), false);
  // The old regular expressions took ~30 s on the first of these; a loose bound, far above the
  // milliseconds they take now.
  assert.ok(Date.now() - t0 < 2000, `${Date.now() - t0} ms`);
});

test("globs are bounded and a malformed one is an invalid_argument", () => {
  const bad = (f: () => unknown, re: RegExp) =>
    assert.throws(f, (e: Error & { code?: string }) => {
      assert.equal(e.code, "invalid_argument", e.message);
      assert.match(e.message, re);
      return true;
    });
  bad(() => new Glob("[z-a]"), /out of order/);
  bad(() => new IgnoreRules("ok\n[z-a].txt\n"), /\.dockerignore line 2: .*out of order/);
  bad(() => new Glob("a".repeat(GLOB_LIMITS.chars + 1)), /longer than/);
  bad(() => new Glob("*x".repeat(GLOB_LIMITS.wildcards + 1)), /wildcards/);
});
