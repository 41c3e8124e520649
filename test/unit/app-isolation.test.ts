/**
 * The application layer's place: src/app imports the services and below, never a front door
 * (src/api, src/e2b, src/console), the daemon or the CLI, and no HTTP framework; the REST API
 * and E2B's API never import each other, and E2B's API nothing of the daemon (what it needs is
 * passed in). Type-only imports count. (The whole tree's layering test supersedes this one.)
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readdir, readFile } from "node:fs/promises";
import { dirname, join, relative, resolve } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";

const SRC = join(REPO_DIR, "src");

async function tsFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...(await tsFiles(p)));
    else if (e.name.endsWith(".ts")) out.push(p);
  }
  return out;
}

const imports = (src: string): string[] =>
  [...src.matchAll(/^\s*(?:import|export)\s[^;]*?from\s+["']([^"']+)["']/gm)].map((m) => m[1] ?? "");

/** Each import of the files under src/`folder`: `file -> target` (a src folder, or a package). */
async function importsOf(folder: string): Promise<{ file: string; target: string }[]> {
  const out: { file: string; target: string }[] = [];
  for (const f of await tsFiles(join(SRC, folder))) {
    for (const spec of imports(await readFile(f, "utf8"))) {
      const target = spec.startsWith(".") ? relative(SRC, resolve(dirname(f), spec)) : spec;
      out.push({ file: relative(SRC, f), target });
    }
  }
  return out;
}

const crossing = (all: { file: string; target: string }[], refused: RegExp): string[] =>
  all.filter((i) => refused.test(i.target)).map((i) => `${i.file} -> ${i.target}`);

test("src/app imports no front door, no daemon or CLI code, and no HTTP framework", async () => {
  const all = await importsOf("app");
  assert.ok(all.length > 10);
  assert.deepEqual(crossing(all, /^(api|e2b|console|daemon|cli)\/|^hono\b|^@hono\//), []);
});

test("the REST API and E2B's API import nothing of each other; E2B's nothing of the daemon", async () => {
  assert.deepEqual(crossing(await importsOf("e2b"), /^(api|daemon)\//), []);
  assert.deepEqual(crossing(await importsOf("api"), /^e2b\//), []);
});
