/**
 * The daemon's process-level failure policy: a rejection nobody handled is logged with its
 * stack and counted, and the process serves on; an uncaught exception is logged, counted and
 * ends the process with EXIT_UNCAUGHT. Checked on a stand-in process and on real ones.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { EventEmitter } from "node:events";
import { join } from "node:path";
import { EXIT_UNCAUGHT, installFailurePolicy } from "../../src/daemon/failure-policy.js";
import type { ProcessFailure } from "../../src/daemon/failure-policy.js";
import { REPO_DIR } from "../../src/host/paths.js";

function recorder() {
  const lines: { msg: string; fields: Record<string, unknown> | undefined }[] = [];
  const counted: ProcessFailure[] = [];
  const exits: number[] = [];
  return {
    lines,
    counted,
    exits,
    log: {
      info: (msg: string, fields?: Record<string, unknown>) => lines.push({ msg, fields }),
      warn: (msg: string, fields?: Record<string, unknown>) => lines.push({ msg, fields }),
    },
  };
}

test("an unhandled rejection is logged with its stack and counted; nothing exits", () => {
  const r = recorder();
  const proc = new EventEmitter();
  const remove = installFailurePolicy({
    log: r.log,
    count: (k) => r.counted.push(k),
    proc,
    exit: (c) => r.exits.push(c),
  });
  proc.emit("unhandledRejection", new Error("controller is already closed"), Promise.resolve());
  proc.emit("unhandledRejection", "a bare string", Promise.resolve());
  assert.deepEqual(r.counted, ["unhandled_rejection", "unhandled_rejection"]);
  assert.deepEqual(r.exits, []);
  assert.equal(r.lines[0]?.fields?.error, "controller is already closed");
  assert.match(String(r.lines[0]?.fields?.stack), /failure-policy\.test/);
  assert.equal(r.lines[1]?.fields?.error, "a bare string");
  remove();
  assert.equal(proc.listenerCount("unhandledRejection"), 0);
  assert.equal(proc.listenerCount("uncaughtException"), 0);
});

test("an uncaught exception is logged and counted, and exits with EXIT_UNCAUGHT", () => {
  const r = recorder();
  const proc = new EventEmitter();
  installFailurePolicy({ log: r.log, count: (k) => r.counted.push(k), proc, exit: (c) => r.exits.push(c) });
  proc.emit("uncaughtException", new TypeError("state is inconsistent"));
  assert.deepEqual(r.counted, ["uncaught_exception"]);
  assert.deepEqual(r.exits, [EXIT_UNCAUGHT]);
  assert.notEqual(EXIT_UNCAUGHT, 0);
  assert.match(String(r.lines[0]?.fields?.stack), /TypeError: state is inconsistent/);
});

/** Runs `body` in a fresh node process with the policy installed; its exit code and stderr. */
function runWithPolicy(body: string): Promise<{ code: number | null; stderr: string }> {
  const policy = join(REPO_DIR, "dist/src/daemon/failure-policy.js");
  const log = join(REPO_DIR, "dist/src/util/log.js");
  const script = `
    const { installFailurePolicy } = await import(${JSON.stringify(policy)});
    const { jsonLogger } = await import(${JSON.stringify(log)});
    installFailurePolicy({ log: jsonLogger("daemon") });
    ${body}
  `;
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ["--input-type=module", "-e", script],
      { timeout: 20_000 },
      (err, _out, stderr) => {
        resolve({ code: err ? (typeof err.code === "number" ? err.code : null) : 0, stderr });
      },
    );
  });
}

test("real processes: a rejection leaves the process serving; an exception ends it non-zero", async () => {
  const rejected = await runWithPolicy(`
    Promise.reject(new Error("nobody awaited this"));
    setTimeout(() => { process.stderr.write("still serving\\n"); process.exit(0); }, 100);
  `);
  assert.equal(rejected.code, 0, rejected.stderr);
  assert.match(rejected.stderr, /"msg":"unhandled promise rejection[^"]*".*nobody awaited this/);
  assert.match(rejected.stderr, /still serving/);

  const thrown = await runWithPolicy(`
    setTimeout(() => { throw new Error("unwound at an unknown point"); }, 10);
    setTimeout(() => { process.stderr.write("should not get here\\n"); }, 2000);
  `);
  assert.equal(thrown.code, EXIT_UNCAUGHT, thrown.stderr);
  assert.match(thrown.stderr, /"msg":"uncaught exception[^"]*".*unwound at an unknown point/);
  assert.doesNotMatch(thrown.stderr, /should not get here/);
});
