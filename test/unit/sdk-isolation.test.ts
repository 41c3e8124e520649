/**
 * The client packages stand alone: the TypeScript SDK imports only its own files and Node's
 * built-ins (nothing from the daemon, no runtime dependencies), and its API types are the ones
 * openapi-typescript generates from the committed OpenAPI document.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { REPO_DIR } from "../../src/host/paths.js";

const SDK = join(REPO_DIR, "sdk", "typescript");

test("the TypeScript SDK imports only its own modules and node: built-ins", async () => {
  const files = (await readdir(join(SDK, "src"))).filter((f) => f.endsWith(".ts"));
  assert.ok(files.length >= 5);
  for (const f of files) {
    const src = await readFile(join(SDK, "src", f), "utf8");
    for (const m of src.matchAll(/(?:import|export)[^"']*?from\s+["']([^"']+)["']/g)) {
      const spec = m[1] ?? "";
      assert.ok(
        spec.startsWith("node:") || /^\.\/[\w.-]+\.js$/.test(spec),
        `${f} imports ${spec}: the SDK may import only ./x.js and node:*`,
      );
    }
  }
  const pkg = JSON.parse(await readFile(join(SDK, "package.json"), "utf8")) as Record<string, unknown>;
  assert.equal(pkg.dependencies, undefined, "the SDK has no runtime dependencies");
});

test("sdk/typescript/src/api.gen.ts is generated from docs/openapi.json", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-gen-"));
  try {
    const out = join(dir, "api.gen.ts");
    await promisify(execFile)(
      join(REPO_DIR, "node_modules", ".bin", "openapi-typescript"),
      [join(REPO_DIR, "docs", "openapi.json"), "-o", out],
      { cwd: REPO_DIR },
    );
    assert.equal(
      await readFile(join(SDK, "src", "api.gen.ts"), "utf8"),
      await readFile(out, "utf8"),
      "run `npm run openapi` after changing the API",
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
