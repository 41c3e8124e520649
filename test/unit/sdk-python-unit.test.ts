/**
 * The Python SDK's own unit tests (sdk/python/tests/test_unit.py: its E2B surface against a fake
 * daemon, no VMs), run with the system python3 so they are part of the unit suite.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";

test("the Python SDK's unit tests pass", async () => {
  const r = await new Promise<{ code: number; out: string }>((resolve) => {
    execFile(
      "python3",
      [join(REPO_DIR, "sdk/python/tests/test_unit.py")],
      { timeout: 120_000, env: { ...process.env, PYTHONDONTWRITEBYTECODE: "1" } },
      (err, stdout, stderr) => resolve({ code: err ? 1 : 0, out: stdout + stderr }),
    );
  });
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /Ran \d+ tests/);
  assert.match(r.out, /\nOK\n/);
});
