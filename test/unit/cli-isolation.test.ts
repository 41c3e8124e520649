/**
 * The CLI is a client like the others: it reaches the daemon only through the TypeScript SDK
 * and holds no daemon code. From src/cli, following every static import, nothing in src/api,
 * src/daemon or any other HTTP client is reached; its only
 * dynamic import is the daemon's entry point, for `forkd daemon` and `forkd gateway`. And it keeps no module
 * state: no top-level `let`/`var`, the environment read in main() alone (and handed to the
 * daemon it starts).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import { dirname, join, relative, resolve } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";

const SRC = join(REPO_DIR, "src");
const CLI = join(SRC, "cli");
/** Packages the CLI may import (node: built-ins aside). */
const PACKAGES = new Set(["commander", "@forkd/sdk"]);
/** Daemon code the CLI may reach: none (the lock autostart checks is src/host/daemon-lock.ts). */
const DAEMON_ALLOWED = new Set<string>([]);

async function tsFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...(await tsFiles(p)));
    else if (e.name.endsWith(".ts")) out.push(p);
  }
  return out;
}

const staticImports = (src: string): string[] =>
  [...src.matchAll(/^\s*(?:import|export)\s[^;]*?from\s+["']([^"']+)["']/gm)].map((m) => m[1] ?? "");
const dynamicImports = (src: string): string[] =>
  [...src.matchAll(/\bimport\(\s*["']([^"']+)["']\s*\)/g)].map((m) => m[1] ?? "");

test("src/cli reaches no daemon code, and the daemon only through the SDK", async () => {
  const start = await tsFiles(CLI);
  assert.ok(start.length >= 10);
  const seen = new Set<string>();
  const queue = [...start];
  const reached: string[] = [];
  while (queue.length > 0) {
    const file = queue.pop() as string;
    if (seen.has(file)) continue;
    seen.add(file);
    const rel = relative(SRC, file);
    reached.push(rel);
    const src = await readFile(file, "utf8");
    for (const spec of staticImports(src)) {
      if (spec.startsWith("node:")) continue;
      if (!spec.startsWith(".")) {
        // Outside src/cli, modules may use their own packages; the CLI itself only these.
        if (file.startsWith(CLI + "/")) assert.ok(PACKAGES.has(spec), `${rel} imports the package ${spec}`);
        continue;
      }
      queue.push(resolve(dirname(file), spec.replace(/\.js$/, ".ts")));
    }
  }
  for (const rel of reached) {
    assert.ok(!rel.startsWith("api/"), `the CLI reaches ${rel}: no API code in a client`);
    assert.ok(
      !rel.startsWith("daemon/") || DAEMON_ALLOWED.has(rel),
      `the CLI reaches ${rel}: no daemon code beyond starting one`,
    );
    assert.ok(!rel.startsWith("client/"), `the CLI reaches ${rel}: its one client is the SDK`);
  }
  // The one dynamic import: `forkd daemon` (and `forkd gateway`) run in this process.
  const dynamic: string[] = [];
  for (const f of start) for (const d of dynamicImports(await readFile(f, "utf8"))) dynamic.push(d);
  assert.deepEqual(dynamic, ["../../daemon/index.js"]);
});

test("src/cli keeps no module state and reads the environment only in main()", async () => {
  for (const f of await tsFiles(CLI)) {
    const rel = relative(REPO_DIR, f);
    const src = await readFile(f, "utf8");
    assert.doesNotMatch(src, /^(?:export\s+)?(?:let|var)\s/m, `${rel}: a module-level let/var`);
    const env = [...src.matchAll(/process\.env/g)].length;
    if (rel === "src/cli/main.ts") assert.equal(env, 1, `${rel}: main(process.argv, process.env) only`);
    else if (rel === "src/cli/autostart.ts")
      assert.ok(env <= 1, `${rel}: the started daemon's environment only`);
    else assert.equal(env, 0, `${rel} reads process.env: take it from the context built in main()`);
  }
});
