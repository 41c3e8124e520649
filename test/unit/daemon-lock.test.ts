import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { acquireDaemonLock, daemonHoldsLock, lockName } from "../../src/host/daemon-lock.js";
import { ForkdError } from "../../src/util/errors.js";

const dir = `/tmp/forkd-lock-test-${process.pid}`;

test("one daemon per data directory; the lock dies with its holder", async () => {
  assert.equal(await daemonHoldsLock(dir), false);
  const release = await acquireDaemonLock(dir);
  assert.equal(await daemonHoldsLock(dir), true);
  await assert.rejects(
    acquireDaemonLock(dir),
    (e: unknown) => e instanceof ForkdError && e.code === "conflict",
  );
  // Another data directory is independent.
  const other = await acquireDaemonLock(dir + "-other");
  await other();
  await release();
  assert.equal(await daemonHoldsLock(dir), false);

  // A holder killed with SIGKILL leaves no stale lock behind.
  const holder = spawn(
    process.execPath,
    [
      "-e",
      `require("node:net").createServer().listen(${JSON.stringify(lockName(dir))}, () => console.log("held"))`,
    ],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  await new Promise((r) => holder.stdout.once("data", r));
  assert.equal(await daemonHoldsLock(dir), true);
  holder.kill("SIGKILL");
  await new Promise((r) => holder.once("exit", r));
  const again = await acquireDaemonLock(dir);
  await again();
});
