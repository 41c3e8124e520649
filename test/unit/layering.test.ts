/**
 * The layers docs/architecture.md draws are the layers the code has: the rules are read from the
 * document's `layers` block (change the rule and the document together), every import under
 * src/ is checked against them, and planted imports that break each rule are caught.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";
import {
  importsOf,
  parseRules,
  readTree,
  violations,
  type Rules,
  type SourceFile,
} from "../helpers/layers.js";

const rules = async (): Promise<Rules> =>
  parseRules(await readFile(join(REPO_DIR, "docs", "architecture.md"), "utf8"));

test("every import under src/ follows the layers docs/architecture.md states", async () => {
  const r = await rules();
  assert.ok(r.layers.length >= 6, "the document's layers block is read");
  const tree = await readTree(join(REPO_DIR, "src"));
  assert.ok(tree.length > 300);
  assert.deepEqual(violations(tree, r), []);
});

test("an upward import planted in the real tree is caught, and only it", async () => {
  const r = await rules();
  const tree = await readTree(join(REPO_DIR, "src"));
  const planted = tree.map((s) =>
    s.file === "vmm/config.ts" ? { ...s, files: [...s.files, "sandbox/index.ts"] } : s,
  );
  const found = violations(planted, r);
  assert.equal(found.length >= 1, true);
  assert.match(found[0] ?? "", /^vmm\/config\.ts imports sandbox\/index\.ts: services is above mechanisms$/);
  assert.ok(
    found.every((v) => v.includes("vmm") || v.includes("sandbox")),
    found.join("\n"),
  );
});

/** A small tree of files with the given imports (texts written as imports). */
const tree = (files: Record<string, string>): SourceFile[] =>
  Object.entries(files).map(([file, text]) => importsOf(file, text));

const RULES = parseRules(
  [
    "```layers",
    "front doors | api e2b | apart",
    "services    | sandbox snapshot",
    "mechanisms  | vmm net",
    "util        | util",
    "packages    | hono: api e2b",
    "```",
  ].join("\n"),
);

test("a clean planted tree passes", () => {
  const ok = tree({
    "api/route.ts": `import { fork } from "../sandbox/index.js"; import { Hono } from "hono";`,
    "e2b/route.ts": `import type { Sandbox } from "../sandbox/index.js";`,
    "sandbox/index.ts": `export { fork } from "./fork.js";\nexport type { Sandbox } from "./fork.js";`,
    "sandbox/fork.ts": `import { start } from "../vmm/index.js"; import { snap } from "../snapshot/index.js";`,
    "snapshot/index.ts": `export { snap } from "./snap.js";`,
    "snapshot/snap.ts": `import { x } from "../util/index.js";`,
    "vmm/index.ts": `export { start } from "./start.js";`,
    "vmm/start.ts": `import { attach } from "../net/index.js";`,
    "net/index.ts": `export { attach } from "./attach.js";`,
    "net/attach.ts": `const m = await import("../util/index.js");`,
    "util/index.ts": `export { x } from "./x.js";`,
    "util/x.ts": ``,
  });
  assert.deepEqual(violations(ok, RULES), []);
});

test("each rule's planted breach is named", () => {
  const cases: [Record<string, string>, RegExp][] = [
    [
      { "vmm/a.ts": `import type { S } from "../sandbox/index.js";` },
      /vmm\/a\.ts imports sandbox\/index\.ts: services is above mechanisms/,
    ],
    [{ "vmm/a.ts": `const s = await import("../sandbox/index.js");` }, /services is above mechanisms/],
    [{ "api/a.ts": `export { x } from "../e2b/index.js";` }, /front doors do not import one another/],
    [{ "api/a.ts": `import { fork } from "../sandbox/fork.js";` }, /reached through sandbox\/index\.ts/],
    [
      { "sandbox/a.ts": `import "../snapshot/index.js";`, "snapshot/b.ts": `import "../sandbox/index.js";` },
      /folders import one another in a cycle: sandbox → snapshot/,
    ],
    [
      { "net/a.ts": `import "./b.js";`, "net/b.ts": `import "./a.js";` },
      /files import one another in a cycle: net\/a\.ts → net\/b\.ts/,
    ],
    [{ "sandbox/a.ts": `import { Hono } from "hono";` }, /sandbox\/a\.ts imports hono: only api, e2b may/],
    [{ "sandbox/index.ts": `export * from "./a.js";` }, /an index holds only/],
    [{ "sandbox/index.ts": `export const x = 1;` }, /an index holds only/],
    [
      { "sandbox/index.ts": `export { v } from "../vmm/index.js";` },
      /an index offers its own folder's files/,
    ],
    [{ "cluster/a.ts": `` }, /folder cluster is in no layer/],
    [{ "version.ts": `` }, /\(src\/ itself\) is in no layer/],
  ];
  for (const [files, want] of cases) {
    const found = violations(tree(files), RULES);
    assert.ok(
      found.some((v) => want.test(v)),
      `${JSON.stringify(files)}: want ${want}, found ${JSON.stringify(found)}`,
    );
  }
});
