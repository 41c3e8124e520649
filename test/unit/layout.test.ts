/**
 * A newcomer finds every mechanism from the tree: each file under src/ says in its header what
 * it holds, and docs/layout.md, the map of the tree made from those headers, is current.
 * `npm run layout` (FORKD_LAYOUT_WRITE=1) rewrites the map.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";
import { headerOf, layoutEntries, renderLayout } from "../helpers/layout.js";

const DOC = join(REPO_DIR, "docs", "layout.md");

test("a header's first sentence, not one cut at a file name or an abbreviation", () => {
  assert.equal(headerOf("/** One thing. And more. */\nx"), "One thing.");
  assert.equal(headerOf("#!/usr/bin/env node\n/**\n * The CLI: a client.\n */"), "The CLI: a client.");
  assert.equal(
    headerOf("/** Moved to vmm/memsnap.ts, e.g. capture. Next. */"),
    "Moved to vmm/memsnap.ts, e.g. capture.",
  );
  assert.equal(headerOf("import x from 'y';\n/** late */"), null);
});

test("every file under src/ has a header saying what it holds", async () => {
  const missing = (await layoutEntries(REPO_DIR)).filter((e) => e.header === null).map((e) => e.file);
  assert.deepEqual(missing, [], "files without a leading /** ... */ comment");
});

test("docs/layout.md is the map of today's tree (npm run layout rewrites it)", async () => {
  const want = renderLayout(await layoutEntries(REPO_DIR));
  if (process.env.FORKD_LAYOUT_WRITE === "1") await writeFile(DOC, want);
  assert.equal(await readFile(DOC, "utf8"), want, "docs/layout.md is stale: run `npm run layout`");
});
