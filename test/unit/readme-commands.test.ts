/**
 * The README's two commands are the project's promise to a newcomer on a fresh Debian 12 machine
 * as root, where `sudo` is not installed: they must run exactly as written there, and the test
 * command must be the one CI runs (.ci/run).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";

/** The commands of the first sh block under "## Two commands". */
async function readmeCommands(): Promise<string[]> {
  const readme = await readFile(join(REPO_DIR, "README.md"), "utf8");
  const section = readme.split(/^## Two commands$/m)[1];
  assert.ok(section, 'README.md has a "## Two commands" section');
  const block = /```sh\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(block, "the section has an sh block");
  return block
    .split("\n")
    .map((l) => l.replace(/#.*$/, "").trim())
    .filter((l) => l !== "");
}

test("the README's two commands need nothing a fresh Debian 12 root shell lacks", async () => {
  const cmds = await readmeCommands();
  assert.equal(cmds.length, 2, `two commands, got ${JSON.stringify(cmds)}`);
  for (const c of cmds) {
    const [prog, script, ...rest] = c.split(/\s+/);
    assert.equal(prog, "bash", `${c}: runs with bash (no sudo, nothing to install first)`);
    assert.ok(
      script && existsSync(join(REPO_DIR, script)),
      `${c}: ${script ?? "?"} exists in the repository`,
    );
    assert.deepEqual(rest, [], `${c}: no arguments a newcomer has to know`);
  }
});

test("the README's test command is what CI runs", async () => {
  const cmds = await readmeCommands();
  const ci = await readFile(join(REPO_DIR, ".ci", "run"), "utf8");
  const run = /^exec (.+)$/m.exec(ci)?.[1]?.trim();
  assert.equal(run, cmds[1], ".ci/run executes the README's second command");
});
