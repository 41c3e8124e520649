/**
 * The Dockerfile parser and planner (no VM): every instruction, continuations and the escape
 * directive, comments, exec and shell forms, ARG before FROM, variable substitution where Docker
 * does it (and not in RUN), legacy ENV, refusals naming their line; the build context: COPY
 * sources that climb out or go through links refused, globs, directories recursively,
 * .dockerignore; a context tar with a hostile entry refused.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { parseDockerfile } from "../../src/image/dockerfile/parse.js";
import { EMPTY_CONFIG, fromRef, plan } from "../../src/image/dockerfile/plan.js";
import type { PlanStep } from "../../src/image/dockerfile/plan.js";
import { word, words } from "../../src/image/dockerfile/words.js";
import { Glob, IgnoreRules } from "../../src/image/dockerfile/ignore.js";
import { BuildContext, hashItems } from "../../src/image/dockerfile/context.js";
import { unpackContext } from "../../src/image/dockerfile/context-tar.js";
import { configFiles } from "../../src/image/dockerfile/image-config.js";

const planOf = (text: string, args: Record<string, string> = {}, base = EMPTY_CONFIG) =>
  plan(parseDockerfile(text), base, args);

/** Asserts `f` throws an invalid_argument naming `line`, matching `re`. */
function refuses(f: () => unknown, line: number | null, re: RegExp): void {
  assert.throws(f, (e: Error & { code?: string; details?: { line?: number } }) => {
    assert.equal(e.code, "invalid_argument", e.message);
    if (line !== null) {
      assert.equal(e.details?.line, line, e.message);
      assert.match(e.message, new RegExp(`line ${line}:`));
    }
    assert.match(e.message, re);
    return true;
  });
}

test("words: Docker's quoting and substitution forms", () => {
  const v = new Map([
    ["A", "x y"],
    ["E", ""],
  ]);
  assert.equal(word("$A", v, "\\"), "x y");
  assert.equal(word("${A}b", v, "\\"), "x yb");
  assert.equal(word("${U:-def}", v, "\\"), "def");
  assert.equal(word("${E:-def}", v, "\\"), "def");
  assert.equal(word("${E-def}", v, "\\"), "");
  assert.equal(word("${A:+set}", v, "\\"), "set");
  assert.equal(word("${U:+set}", v, "\\"), "");
  assert.equal(word("'$A'", v, "\\"), "$A");
  assert.equal(word('"$A"', v, "\\"), "x y");
  assert.equal(word("\\$A", v, "\\"), "$A");
  assert.equal(word("`$A", v, "`"), "$A");
  assert.equal(word("$", v, "\\"), "$");
  assert.deepEqual(words("a \"b c\" 'd e' $A", v, "\\"), ["a", "b c", "d e", "x y"]);
  assert.deepEqual(words('"" x', v, "\\"), ["", "x"]);
  assert.throws(() => word("${U:?missing}", v, "\\"), /U: missing/);
  assert.throws(() => word("${A#x}", v, "\\"), /unsupported substitution/);
  assert.throws(() => word("'open", v, "\\"), /unterminated/);
});

test("every supported instruction, continuations, comments and forms", () => {
  const p = planOf(
    [
      "# syntax=docker/dockerfile:1",
      "ARG TAG=3.11",
      "FROM python:${TAG} AS build",
      "ARG TAG",
      "ARG V=1",
      'ENV A=1 B="two words" \\',
      "    # a comment inside a continuation",
      "    C=$A-${V}",
      "ENV LEGACY some value $A",
      'LABEL org.x="y z" v=$V',
      "WORKDIR /srv",
      "WORKDIR app",
      "USER ${A}000:1000",
      "COPY --chown=app:app --chmod=0644 a.txt b/ ./",
      'COPY ["c d.txt", "/dest/"]',
      "ADD e.txt /e",
      "RUN echo $A \\",
      "  && echo done",
      'RUN ["/bin/echo", "$A"]',
      'ENTRYPOINT ["/bin/app"]',
      "CMD serve --port 80",
    ].join("\n"),
  );
  assert.equal(p.from.ref, "python:3.11");
  assert.equal(p.from.line, 3);
  const env: Record<string, string> = {};
  for (const e of p.config.env) env[e.slice(0, e.indexOf("="))] = e.slice(e.indexOf("=") + 1);
  assert.deepEqual(env, {
    A: "1",
    B: "two words",
    C: "-1" /* Docker expands with the values from before the instruction */,
    LEGACY: "some value 1",
  });
  assert.deepEqual(p.config.labels, { "org.x": "y z", v: "1" });
  assert.equal(p.config.workingDir, "/srv/app");
  assert.equal(p.config.user, "1000:1000");
  assert.deepEqual(p.config.entrypoint, ["/bin/app"]);
  assert.deepEqual(p.config.cmd, ["/bin/sh", "-c", "serve --port 80"]);
  const [c1, c2, c3, r1, r2] = p.steps as [PlanStep, PlanStep, PlanStep, PlanStep, PlanStep];
  assert.deepEqual(c1, {
    kind: "copy",
    line: 14,
    add: false,
    sources: ["a.txt", "b/"],
    dest: "/srv/app/",
    chown: "app:app",
    chmod: 0o644,
  });
  assert.equal(c2.kind === "copy" && c2.dest, "/dest/");
  assert.deepEqual(c2.kind === "copy" && c2.sources, ["c d.txt"]);
  assert.equal(c3.kind === "copy" && c3.add, true);
  // RUN is not expanded by forkd (its shell does it) but gets the variables as its env.
  assert.equal(r1.kind, "run");
  if (r1.kind === "run") {
    assert.equal(r1.line, 17);
    assert.deepEqual(r1.command, { shell: "echo $A   && echo done" });
    assert.equal(r1.env.A, "1");
    assert.equal(r1.env.TAG, "3.11", "a pre-FROM ARG redeclared after FROM keeps its value");
    assert.equal(r1.env.V, "1");
    assert.equal(r1.cwd, "/srv/app");
    assert.equal(r1.user, "1000:1000");
  }
  assert.deepEqual(r2.kind === "run" && r2.command, { exec: ["/bin/echo", "$A"] });
});

test("build args, base config and the escape directive", () => {
  const df = "# escape=`\nARG IMG=alpine\nFROM $IMG\nARG X=dflt\nENV P=$PATH:/opt `\n  Q=$X\nRUN echo \\ok\n";
  assert.equal(fromRef(parseDockerfile(df), { IMG: "debian" }).ref, "debian");
  const p = planOf(df, { X: "given" }, { ...EMPTY_CONFIG, env: ["PATH=/usr/bin"], workingDir: "/w" });
  assert.ok(p.config.env.includes("P=/usr/bin:/opt"));
  assert.ok(p.config.env.includes("Q=given"));
  assert.equal(p.config.workingDir, "/w");
  assert.deepEqual(p.steps[0]?.kind === "run" && p.steps[0].command, { shell: "echo \\ok" });
  assert.equal(p.steps[0]?.kind === "run" && p.steps[0].cwd, "/w");
});

test("refusals name their line", () => {
  refuses(() => parseDockerfile("FROM a\nEXPOSE 80\n"), 2, /EXPOSE is not supported/);
  refuses(() => parseDockerfile("FROM a\n\nFROBNICATE x\n"), 3, /unknown instruction FROBNICATE/);
  refuses(() => parseDockerfile("FROM a\nFROM b\n"), 2, /multi-stage/);
  refuses(() => parseDockerfile("RUN x\nFROM a\n"), 1, /before FROM/);
  refuses(() => parseDockerfile("FROM a\nCOPY --from=b x /x\n"), 2, /multi-stage/);
  refuses(
    () => parseDockerfile("FROM a\nRUN --mount=type=cache,target=/x true\n"),
    2,
    /--mount is not supported/,
  );
  refuses(() => parseDockerfile("FROM a\nCOPY --link x /x\n"), 2, /--link is not supported/);
  refuses(() => parseDockerfile("FROM a\nRUN <<EOF\necho hi\nEOF\n"), 2, /heredocs/);
  refuses(() => parseDockerfile("FROM --platform=linux/arm64 a\n"), 1, /only linux\/amd64/);
  refuses(() => parseDockerfile("FROM a\nRUN\n"), 2, /needs a command/);
  refuses(() => parseDockerfile('FROM a\nCMD ["a", 1]\n'), 2, /array of strings/);
  refuses(() => planOf("FROM a\nADD https://example.com/x /x\n"), 2, /URLs are not supported/);
  refuses(() => planOf("FROM a\nCOPY onlyone\n"), 2, /a source and a destination/);
  refuses(() => planOf("FROM a\nENV novalue\n"), 2, /needs a value/);
  refuses(() => planOf("FROM a\nUSER $U:${U:?no user}\n"), 2, /no user/);
  refuses(() => planOf("FROM a\nCOPY --chmod=rwx a /a\n"), 2, /octal mode/);
  refuses(() => parseDockerfile("# escape=x\nFROM a\n"), 1, /escape must be/);
  refuses(() => parseDockerfile("ARG X\n"), null, /no FROM/);
  refuses(() => parseDockerfile("FROM a\n" + "RUN true\n".repeat(1001)), 1001, /more than 1000 instructions/);
  assert.throws(() => parseDockerfile("FROM a\n" + "x".repeat(2 << 20)), /larger than/);
});

test("the build context: globs, directories, .dockerignore, no escapes", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-ctx-"));
  try {
    await mkdir(join(dir, "src/lib"), { recursive: true });
    await writeFile(join(dir, "src/a.py"), "a");
    await writeFile(join(dir, "src/b.py"), "b");
    await writeFile(join(dir, "src/lib/c.py"), "c", { mode: 0o755 });
    await writeFile(join(dir, "src/notes.txt"), "n");
    await writeFile(join(dir, "secret.key"), "k");
    await mkdir(join(dir, "node_modules/x"), { recursive: true });
    await writeFile(join(dir, "node_modules/x/i.js"), "i");
    await writeFile(join(dir, ".dockerignore"), "# comment\n*.key\nnode_modules\nsrc/*.txt\n");
    const c = await BuildContext.scan(dir);
    assert.ok(!c.entries.has("secret.key"));
    assert.ok(!c.entries.has("node_modules/x/i.js"));
    assert.ok(!c.entries.has("src/notes.txt"));
    const glob = c.resolve(5, "COPY", ["src/*.py"], "/app/");
    assert.deepEqual(
      glob.map((i) => i.dest),
      ["/app/a.py", "/app/b.py"],
    );
    const tree = c.resolve(5, "COPY", ["src"], "/app");
    assert.deepEqual(
      tree.map((i) => `${i.dest}:${i.type}`),
      ["/app:dir", "/app/a.py:file", "/app/b.py:file", "/app/lib:dir", "/app/lib/c.py:file"],
    );
    assert.equal(tree.find((i) => i.dest === "/app/lib/c.py")?.mode, 0o755);
    assert.deepEqual(
      c.resolve(5, "COPY", ["src/a.py"], "/x/renamed.py").map((i) => i.dest),
      ["/x/renamed.py"],
    );
    assert.deepEqual(
      c.resolve(5, "COPY", ["/src/?.py"], "/q/").map((i) => i.dest),
      ["/q/a.py", "/q/b.py"],
    );
    refuses(() => c.resolve(7, "COPY", ["../etc/passwd"], "/x"), 7, /outside the build context/);
    refuses(() => c.resolve(7, "COPY", ["src/../../x"], "/x"), 7, /outside the build context/);
    refuses(() => c.resolve(7, "COPY", ["secret.key"], "/x"), 7, /left out by \.dockerignore/);
    refuses(() => c.resolve(7, "COPY", ["src/a.py", "src/b.py"], "/x"), 7, /ending in \//);
    refuses(() => c.resolve(7, "COPY", ["*.nothing"], "/x/"), 7, /no file in the build context matches/);
    // A file's content, mode and destination make the hash.
    const h1 = await hashItems(glob);
    await writeFile(join(dir, "src/b.py"), "b2");
    assert.notEqual(await hashItems(glob), h1);
    // A symbolic link (which could point anywhere) is refused, never followed.
    await symlink("/etc/passwd", join(dir, "src/link"));
    await assert.rejects(BuildContext.scan(dir), /src\/link is a symbolic link/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test(".dockerignore rules: later wins, ! re-includes, ** spans directories", () => {
  const r = new IgnoreRules("**/*.log\n!keep.log\ndocs\n!docs/README.md\n/build/\n");
  assert.ok(r.ignored("a/b/c.log"));
  assert.ok(r.ignored("x.log"));
  assert.ok(!r.ignored("keep.log"));
  assert.ok(r.ignored("docs/guide.md"));
  assert.ok(!r.ignored("docs/README.md"));
  assert.ok(r.ignored("build/out.o"));
  assert.ok(!r.ignored("src/build.ts"));
  assert.ok(new Glob("a/[bc]?.txt").test("a/cx.txt"));
  assert.ok(!new Glob("a/*.txt").test("a/b/c.txt"));
});

test("a context tar: files and modes kept, escapes and links refused", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-ctxtar-"));
  try {
    const src = join(dir, "src");
    await mkdir(join(src, "d"), { recursive: true });
    await writeFile(join(src, "d/run.sh"), "#!/bin/sh\n", { mode: 0o750 });
    await writeFile(join(src, "Dockerfile"), "FROM x\n");
    const tarOf = (args: string[]) => execFileSync("tar", ["-c", "-f", "-", ...args], { cwd: src });
    const out = join(dir, "out");
    await unpackContext(Readable.from([tarOf(["Dockerfile", "d"])]), out);
    assert.equal(await readFile(join(out, "Dockerfile"), "utf8"), "FROM x\n");
    const c = await BuildContext.scan(out);
    assert.equal(c.entries.get("d/run.sh")?.mode, 0o750);
    // A member named ../x would land outside.
    const evil = execFileSync("tar", ["-c", "-f", "-", "-P", "--transform", "s,^,../,", "Dockerfile"], {
      cwd: src,
    });
    await assert.rejects(
      unpackContext(Readable.from([evil]), join(dir, "out2")),
      /not a path inside the context/,
    );
    await symlink("/etc", join(src, "l"));
    await assert.rejects(
      unpackContext(Readable.from([tarOf(["l"])]), join(dir, "out3")),
      /not a plain file or directory/,
    );
    await assert.rejects(
      unpackContext(Readable.from([tarOf(["Dockerfile"])]), join(dir, "out4"), 3),
      /larger than 3 bytes/,
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("the image config files: NUL-ended env, key=value config", () => {
  const f = configFiles({
    env: ["A=1", "B=x y"],
    workingDir: "/app",
    user: "app",
    cmd: ["a", "b"],
    entrypoint: null,
    labels: {},
  });
  assert.equal(f.env.toString(), "A=1\0B=x y\0");
  assert.equal(f.config.toString(), 'cwd=/app\nuser=app\ncmd=["a","b"]\n');
});
