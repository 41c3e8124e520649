/**
 * BRANCH's choice of capture (FORKD_BRANCH_LIVE) and a live capture's failures, on the fake VMM
 * with a fake live capture (test/fakes/live.ts): `on` goes live and a failure fails the branch
 * cleanly with the source running; `auto` goes live only above LIVE_MIN_BYTES and falls back
 * to the stopped copy when the live one fails; `off` never goes live.
 */
import assert from "node:assert/strict";
import { readdir } from "node:fs/promises";
import { test } from "node:test";
import { ForkdError } from "../../src/util/errors.js";
import { LIVE_MIN_BYTES } from "../../src/vmm/live-capture.js";
import type { LiveMode } from "../../src/vmm/live-capture.js";
import { fakeLiveCapture } from "../fakes/live.js";
import { fakeSandboxes, forkOne } from "../helpers/fake-sandboxes.js";
import type { FakeSandboxes } from "../helpers/fake-sandboxes.js";

async function withLive(
  mode: LiveMode,
  estimate: number,
  fn: (fx: FakeSandboxes, live: { starts: number }) => Promise<void>,
): Promise<void> {
  // The fake capture reads the fake host's memory, which exists once the sandboxes do.
  const made: { fx?: FakeSandboxes } = {};
  const live = fakeLiveCapture(
    () => {
      assert.ok(made.fx);
      return made.fx.host.memory;
    },
    () => estimate,
  );
  const fx = await fakeSandboxes({ branchLive: mode, liveCapture: live });
  made.fx = fx;
  try {
    await fn(fx, live);
  } finally {
    await fx.cleanup();
  }
}

const sh = async (fx: FakeSandboxes, id: string, cmd: string): Promise<string> =>
  fx.svc.use(id, async (agent) => {
    const out: Buffer[] = [];
    const r = await agent.exec({ shell: cmd }, { onStdout: (d) => out.push(d) }).result;
    assert.equal(r.exitCode, 0);
    return Buffer.concat(out).toString();
  });

const migrations = (fx: FakeSandboxes) => fx.host.faults.calls.get("migrateRam") ?? 0;

test("on: a branch is captured live (the migration's stop is the pause); its children fork", async () => {
  await withLive("on", 0, async (fx, live) => {
    const id = await forkOne(fx);
    const b = await fx.svc.branch(id, "br1", true);
    assert.equal(b.status, "ready");
    assert.equal(live.starts, 1);
    assert.equal(migrations(fx), 1);
    assert.equal(fx.svc.get(id).state, "running");
    assert.equal((await sh(fx, id, "echo source")).trim(), "source");
    const r = await fx.svc.fork("br1", 1);
    assert.deepEqual(r.failures, []);
  });
});

for (const op of ["migrateRam", "migrationFinish"] as const) {
  test(`on: a live capture failing at ${op} fails the branch cleanly; the source runs on`, async () => {
    await withLive("on", 0, async (fx) => {
      const id = await forkOne(fx);
      fx.host.inject(op, { fail: "no stream" });
      await assert.rejects(fx.svc.branch(id, "br1", true), (e: unknown) => e instanceof ForkdError);
      assert.equal(fx.svc.get(id).state, "running");
      assert.equal((await sh(fx, id, "echo alive")).trim(), "alive");
      assert.equal(await fx.store.has("br1"), false, "no snapshot published");
      assert.equal(await fx.store.pending("br1"), null, "nor left writing");
      assert.deepEqual(
        (await readdir(fx.store.root)).filter((n) => n !== "base"),
        [],
        "no staging left",
      );
      // The next branch works (after a failure before the disk froze: the fake's layers are not
      // real qcow2, which a later branch would flatten).
      if (op === "migrateRam") assert.equal((await fx.svc.branch(id, "br1", true)).status, "ready");
    });
  });
}

test("auto: live above LIVE_MIN_BYTES, falling back to the stopped copy when the live one fails", async () => {
  await withLive("auto", LIVE_MIN_BYTES, async (fx) => {
    const id = await forkOne(fx);
    fx.host.inject("migrateRam", { fail: "does not converge" });
    const b = await fx.svc.branch(id, "br1", true);
    assert.equal(b.status, "ready");
    assert.equal(migrations(fx), 1, "it tried live");
    assert.ok(
      fx.warnings.some((w) => /live capture failed/.test(w)),
      fx.warnings.join("; "),
    );
    assert.equal(fx.svc.get(id).state, "running");
  });
});

test("auto below LIVE_MIN_BYTES, and off: the stopped copy, no migration", async () => {
  for (const [mode, estimate] of [
    ["auto", LIVE_MIN_BYTES - 4096],
    ["off", LIVE_MIN_BYTES * 4],
  ] as const) {
    await withLive(mode, estimate, async (fx) => {
      const id = await forkOne(fx);
      assert.equal((await fx.svc.branch(id, "br1", true)).status, "ready");
      assert.equal(migrations(fx), 0, mode);
    });
  }
});
