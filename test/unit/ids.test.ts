import { test } from "node:test";
import assert from "node:assert/strict";
import { SANDBOX_ID_RE, assertSandboxId, assertTag, isValidTag, newSandboxId } from "../../src/util/ids.js";

test("tags: the documented pattern, nothing that could escape a directory", () => {
  for (const ok of ["py", "a", "A-1_b.c", "x".repeat(64), "v1.2.3"]) assert.ok(isValidTag(ok), ok);
  for (const bad of [
    "",
    ".",
    "..",
    "../etc",
    "a/b",
    "-a",
    ".hidden",
    "x".repeat(65),
    "a b",
    "a\0",
    "é",
    5,
    null,
  ]) {
    assert.ok(!isValidTag(bad), String(bad));
  }
  assert.throws(() => assertTag("../x"), /invalid tag/);
});

test("sandbox ids are random, well-formed and validated", () => {
  const ids = new Set(Array.from({ length: 1000 }, newSandboxId));
  assert.equal(ids.size, 1000);
  for (const id of ids) assert.match(id, SANDBOX_ID_RE);
  assert.throws(() => assertSandboxId("sb-../../etc"), /invalid sandbox id/);
  assert.throws(() => assertSandboxId("1"), /invalid sandbox id/);
});
