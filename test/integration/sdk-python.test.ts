/**
 * The Python SDK as its users get it: `pip install ./sdk/python` into a fresh venv, then its own
 * integration suite (sdk/python/tests) and E2B's quick start with only the import changed, both
 * against a real daemon and real VMs.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { cp, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_DIR } from "../../src/host/paths.js";
import { checkedRequest } from "../helpers/contract.js";
import { steps } from "../helpers/steps.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";

const SNAP = "py-sdk";
const PYTHON = existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
let d: TestDaemon;
let venv: string;
const { step, failed } = steps();

function run(
  cmd: string,
  args: string[],
  opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      cmd,
      args,
      {
        cwd: opts.cwd ?? REPO_DIR,
        env: opts.env ?? process.env,
        timeout: opts.timeoutMs ?? 600_000,
        maxBuffer: 16 << 20,
      },
      (err, stdout, stderr) =>
        resolve({ code: err ? (typeof err.code === "number" ? err.code : 1) : 0, stdout, stderr }),
    );
  });
}

before(async () => {
  d = await makeDaemon({ FORKD_POOL_SIZE: "1" });
  venv = await mkdtemp(join(tmpdir(), "forkd-venv-"));
});

after(async () => {
  await d.destroy(failed());
  await rm(venv, { recursive: true, force: true });
});

const sdkEnv = () => ({
  ...process.env,
  FORKD_SOCKET: d.ep.socket,
  FORKD_URL: "",
  FORKD_TEST_SNAPSHOT: SNAP,
  PYTHONDONTWRITEBYTECODE: "1",
});

step("pip install ./sdk/python into a fresh venv", async () => {
  const mk = await run(PYTHON, ["-m", "venv", venv]);
  assert.equal(mk.code, 0, mk.stderr);
  // From a copy: setuptools builds in the source tree (build/, *.egg-info), which must stay clean.
  const copy = join(venv, "src");
  await cp(join(REPO_DIR, "sdk"), join(copy, "sdk"), { recursive: true });
  const pip = await run(join(venv, "bin", "pip"), ["install", "--quiet", "./sdk/python"], { cwd: copy });
  assert.equal(pip.code, 0, pip.stdout + pip.stderr);
  const where = await run(join(venv, "bin", "python"), ["-c", "import forkd; print(forkd.__file__)"], {
    cwd: venv,
  });
  assert.equal(where.code, 0, where.stderr);
  assert.ok(where.stdout.startsWith(venv), `imported from ${where.stdout}, not the venv`);
});

step("a snapshot with warm Python globals for the suite", async () => {
  await checkedRequest(
    d.ep,
    "POST",
    "/v1/snapshots",
    { tag: SNAP, memory_mib: 384, warm_eval: "seed_value = 41" },
    900_000,
  );
});

step("the Python SDK's integration suite passes against the daemon", async () => {
  const r = await run(join(venv, "bin", "python"), [join(REPO_DIR, "sdk/python/tests/test_integration.py")], {
    cwd: venv,
    env: sdkEnv(),
    timeoutMs: 900_000,
  });
  process.stderr.write(
    r.stderr
      .split("\n")
      .filter((l) => / \.\.\. /.test(l))
      .join("\n") + "\n",
  );
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.match(r.stderr, /Ran \d+ tests/);
  // every test ran: none is skipped
  assert.match(r.stderr, /\nOK\n/);
});

step("E2B's quick start runs with only its import line changed", async () => {
  const r = await run(
    join(venv, "bin", "python"),
    [join(REPO_DIR, "docs/examples/python/e2b_quickstart.py")],
    {
      cwd: venv,
      env: { ...sdkEnv(), FORKD_SNAPSHOT: SNAP },
      timeoutMs: 600_000,
    },
  );
  assert.equal(r.code, 0, r.stdout + r.stderr);
  const lines = r.stdout.trim().split("\n");
  assert.match(lines[0] ?? "", /Logs\(stdout=\['hello world\\n'\], stderr=\[\]\)/);
  assert.match(lines[1] ?? "", /EntryInfo\(name='root', type='dir'/);
  assert.equal(lines[2], "2");
});
