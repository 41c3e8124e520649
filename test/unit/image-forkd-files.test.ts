/**
 * The image config as /.forkd/env and /.forkd/config (the formats the agent reads), refusing
 * what those formats cannot hold; the shell quoting of start_cmd.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { test } from "node:test";
import { promisify } from "node:util";
import { envMap, forkdConfigFile, forkdEnvFile } from "../../src/image/forkd-files.js";
import { shellQuote } from "../../src/snapshot/start-ready.js";
import { ForkdError } from "../../src/util/errors.js";

const invalid = (e: unknown) => e instanceof ForkdError && e.code === "invalid_argument";

test("Env entries each end with a NUL byte; no Env, no file", () => {
  assert.deepEqual(forkdEnvFile(["A=1", "B=x=y", "EMPTY="]), Buffer.from("A=1\0B=x=y\0EMPTY=\0"));
  assert.equal(forkdEnvFile([]).length, 0);
  for (const bad of ["NOEQUALS", "=value", "A=with\0nul"]) assert.throws(() => forkdEnvFile([bad]), invalid);
  assert.throws(() => forkdEnvFile(Array.from({ length: 5000 }, (_, i) => `K${i}=v`)), invalid);
  assert.throws(() => forkdEnvFile([`BIG=${"x".repeat(2 << 20)}`]), invalid);
  assert.deepEqual(envMap(["A=1", "A=2", "B=x=y"]), { A: "2", B: "x=y" });
});

test("config holds cwd and user lines, only those the image sets", () => {
  assert.equal(forkdConfigFile({ workingDir: "/srv/app", user: "app:app" }), "cwd=/srv/app\nuser=app:app\n");
  assert.equal(forkdConfigFile({ workingDir: null, user: "1000" }), "user=1000\n");
  assert.equal(forkdConfigFile({ workingDir: "", user: null }), "");
  assert.throws(() => forkdConfigFile({ workingDir: "relative", user: null }), invalid);
  assert.throws(() => forkdConfigFile({ workingDir: "/a\nuser=root", user: null }), invalid);
  assert.throws(() => forkdConfigFile({ workingDir: null, user: "x\ny" }), invalid);
});

test("a start command reaches the guest's shell as it was written", async () => {
  const sh = promisify(execFile);
  for (const cmd of [`echo 'it''s' "$HOME" \`x\` \\`, "a'b", "''", "\n;$(x)"]) {
    const { stdout } = await sh("/bin/sh", ["-c", `printf %s ${shellQuote(cmd)}`]);
    assert.equal(stdout, cmd);
  }
});
