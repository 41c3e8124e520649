/**
 * The absolute deadline and the sandbox-wide env over the fake VMM: a deadline ends a sandbox
 * in use (kill) or pauses it (and is cleared then), setDeadline is persisted and honoured by the
 * daemon after a restart, and record.env is under every command's own env, also after a restart.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { forkOne, readRecord, sh, until, withSandboxes } from "../helpers/fake-sandboxes.js";

test("deadline (kill): a sandbox in use is killed when its deadline comes", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx, { deadlineMs: 300 });
    const rec = await readRecord(fx, id);
    assert.ok(rec.deadline && Date.parse(rec.deadline) > Date.parse(rec.created), "written with the record");
    assert.equal(rec.onDeadline, "kill");
    const lease = fx.svc.lease(id);
    try {
      await until("the busy sandbox to be killed", () => fx.svc.get(id).state === "exited", 10_000);
      assert.equal(fx.svc.get(id).exitReason, "timeout: its deadline came");
    } finally {
      lease.release();
    }
  });
});

test("deadline (pause): the sandbox is paused and its deadline cleared", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx, { deadlineMs: 200, onDeadline: "pause" });
    await until("the sandbox to be paused", () => fx.svc.get(id).state === "paused", 10_000);
    await until(
      "the deadline to be cleared",
      async () => (await readRecord(fx, id)).deadline === null,
      5_000,
    );
    await new Promise((r) => setTimeout(r, 1_500));
    assert.equal(fx.svc.get(id).state, "paused", "nothing more happens to it");
    await fx.svc.resume(id);
    assert.equal(fx.svc.get(id).state, "running");
  });
});

test("resume with a deadline: written with the resume itself, then honoured", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    await fx.svc.pause(id);
    await fx.svc.resume(id, { deadlineMs: 1_500 });
    const rec = await readRecord(fx, id);
    assert.equal(rec.paused, undefined, "the record on disk is the resumed one");
    assert.ok(rec.deadline && Math.abs(Date.parse(rec.deadline) - (Date.now() + 1_500)) < 1_000);
    await until(
      "the resumed sandbox to be killed at its deadline",
      () => fx.svc.get(id).state === "exited",
      10_000,
    );
    const plain = await forkOne(fx);
    await fx.svc.pause(plain);
    await fx.svc.resume(plain);
    assert.equal((await readRecord(fx, plain)).deadline ?? null, null, "a plain resume sets none");
  });
});

test("setDeadline: persisted, and honoured by the daemon after a restart", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    assert.equal((await readRecord(fx, id)).deadline, undefined, "none by default");
    await fx.svc.setDeadline(id, 60_000);
    const far = (await readRecord(fx, id)).deadline;
    assert.ok(far && Math.abs(Date.parse(far) - (Date.now() + 60_000)) < 5_000);
    await fx.svc.setDeadline(id, 1_500);
    const svc = await fx.restart();
    await svc.recover();
    assert.equal(svc.get(id).state, "running", "adopted");
    assert.equal(svc.get(id).record.deadline, (await readRecord(fx, id)).deadline);
    await until(
      "the adopted sandbox to be killed at its deadline",
      () => svc.get(id).state === "exited",
      10_000,
    );
    await svc.setDeadline(id, 1_000).then(
      () => assert.fail("an exited sandbox has no deadline to set"),
      (e: unknown) => assert.match(String(e), /exited/),
    );
  });
});

test("env: under every command's own env, kept in the record and after a restart", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx, { env: { FORKD_SB_VAR: "sandbox", OTHER: "x" } });
    assert.deepEqual((await readRecord(fx, id)).env, { FORKD_SB_VAR: "sandbox", OTHER: "x" });
    assert.equal((await sh(fx, id, "echo $FORKD_SB_VAR $OTHER")).trim(), "sandbox x");
    assert.equal((await sh(fx, id, "echo $FORKD_SB_VAR $OTHER", { FORKD_SB_VAR: "own" })).trim(), "own x");
    const plain = await forkOne(fx);
    assert.equal((await sh(fx, plain, "echo -$FORKD_SB_VAR-")).trim(), "--", "another sandbox has none");
    const svc = await fx.restart();
    await svc.recover();
    const out = await svc.use(id, async (agent) => {
      const chunks: Buffer[] = [];
      await agent.exec({ shell: "echo $FORKD_SB_VAR" }, { onStdout: (d) => chunks.push(d) }).result;
      return Buffer.concat(chunks).toString().trim();
    });
    assert.equal(out, "sandbox", "the adopted sandbox's commands see it too");
  });
});
