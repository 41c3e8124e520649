/**
 * The sandbox state machine on the fake VMM, through SandboxService's public methods: idle
 * timeouts (kill and pause), lifetimes, pause and resume that fail (the sandbox stays coherent),
 * a fork where some children fail, a VMM that dies in the middle of a BRANCH.
 */
import assert from "node:assert/strict";
import { sandboxView } from "../../src/api/views/sandbox.js";
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { ForkdError } from "../../src/util/errors.js";
import { fakeSandboxes, forkOne, readRecord, sh, until, withSandboxes } from "../helpers/fake-sandboxes.js";
import type { FakeSandboxes } from "../helpers/fake-sandboxes.js";

/** The guest scratch directory of a running sandbox's fake VM. */
function guestDir(fx: FakeSandboxes, id: string): string {
  const g = fx.host.process(fx.svc.get(id).record.pid)?.guest;
  assert.ok(g);
  return g.dir;
}

test("a forked child runs its commands for real; kill stops its VMM and removes its files", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    assert.equal((await sh(fx, id, "echo hello")).trim(), "hello");
    const pid = fx.svc.get(id).record.pid;
    assert.ok(fx.host.process(pid));
    const g = fx.host.process(pid)?.guest;
    assert.deepEqual(
      g?.identities.map((i) => i.sandboxId),
      [id],
      "the child was given its identity",
    );
    await fx.svc.kill(id);
    assert.equal(fx.host.process(pid), undefined);
    assert.deepEqual(await fx.dirs(), []);
    assert.throws(() => fx.svc.get(id), /no sandbox/);
  });
});

test("idle timeout (kill): an idle child is killed; one in use is not until released", async () => {
  await withSandboxes(async (fx) => {
    const idle = await forkOne(fx, { timeoutMs: 100 });
    const busy = await forkOne(fx, { timeoutMs: 100 });
    const lease = fx.svc.lease(busy);
    await until("the idle child to exit", () => fx.svc.get(idle).state === "exited");
    assert.equal(fx.svc.get(idle).exitReason, "idle timeout");
    await until("the idle child's files to be gone", async () => (await fx.dirs()).length === 1);
    assert.deepEqual(await fx.dirs(), [busy]);
    assert.equal(fx.svc.get(busy).state, "running", "a child in use is never idle");
    assert.equal(
      fx.svc
        .list()
        .map((x) => sandboxView(x))
        .find((v) => v.id === busy)?.expires_at !== null,
      true,
    );
    lease.release();
    await until("the released child to exit", () => fx.svc.get(busy).state === "exited");
    await until("both VMMs to be gone", () => fx.host.processes().length === 0);
  });
});

test("idle timeout (pause): the child is paused, then resumes with its files and a new identity", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx, { timeoutMs: 100, onIdle: "pause" });
    const scratch = guestDir(fx, id);
    await sh(fx, id, `echo kept > ${scratch}/f`);
    const pid = fx.svc.get(id).record.pid;
    await until("the child to be paused", () => fx.svc.get(id).state === "paused");
    assert.equal(fx.host.process(pid), undefined, "its VMM is gone while paused");
    const rec = await readRecord(fx, id);
    assert.ok(rec.paused && !rec.paused.pending, "the record names the finished image");
    const v = await fx.svc.resume(id);
    assert.equal(v.state, "running");
    assert.notEqual(v.record.pid, pid, "a new VMM process");
    assert.equal((await sh(fx, id, `cat ${scratch}/f`)).trim(), "kept");
    const g = fx.host.process(v.record.pid)?.guest;
    assert.deepEqual(
      g?.identities.map((i) => i.sandboxId),
      [id, id],
      "identity given again on resume",
    );
    assert.equal((await readRecord(fx, id)).paused, undefined);
  });
});

test("idle timeout (pause) whose pause fails kills the child, with why", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx, { timeoutMs: 100, onIdle: "pause" });
    fx.host.inject("pause", { fail: "frozen solid", pid: fx.svc.get(id).record.pid });
    await until("the child to exit", () => fx.svc.get(id).state === "exited");
    assert.equal(fx.svc.get(id).exitReason, "idle timeout (pause failed)");
    assert.ok(fx.warnings.includes("idle pause failed; killing"));
    await until(
      "its VMM and files to be gone",
      async () => (await fx.dirs()).length === 0 && fx.host.processes().length === 0,
    );
  });
});

test("setIdleTimeout sets and clears the idle timeout", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    assert.equal(fx.svc.list().map((x) => sandboxView(x))[0]?.expires_at, null);
    const v = sandboxView(await fx.svc.setIdleTimeout(id, 3_600_000));
    assert.ok(v.expires_at !== null && Date.parse(v.expires_at) > Date.now());
    assert.equal((await readRecord(fx, id)).timeoutMs, 3_600_000, "persisted");
    assert.equal(sandboxView(await fx.svc.setIdleTimeout(id, null)).expires_at, null);
    await fx.svc.setIdleTimeout(id, 50);
    await until("the child to exit", () => fx.svc.get(id).state === "exited");
    assert.equal(fx.svc.get(id).exitReason, "idle timeout");
  });
});

test("lifetime: a child is killed when it ends, in use or paused", async () => {
  await withSandboxes(async (fx) => {
    const used = await forkOne(fx, { limits: { lifetimeMs: 300 } });
    const paused = await forkOne(fx, { limits: { lifetimeMs: 300 } });
    const lease = fx.svc.lease(used);
    await fx.svc.pause(paused);
    assert.equal(fx.svc.get(paused).state, "paused");
    const v = fx.svc
      .list()
      .map((x) => sandboxView(x))
      .find((x) => x.id === used);
    assert.ok(v?.ends_at && Date.parse(v.ends_at) === Date.parse(v.created) + 300);
    await until("both to exit", () =>
      fx.svc
        .list()
        .map((x) => sandboxView(x))
        .every((x) => x.state === "exited"),
    );
    for (const id of [used, paused])
      assert.match(fx.svc.get(id).exitReason ?? "", /^killed by the host: lifetime of 0.3 s over$/);
    lease.release();
    await until(
      "its VMM and files to be gone",
      async () => (await fx.dirs()).length === 0 && fx.host.processes().length === 0,
    );
  });
});

test("a pause that fails before its VMM stops leaves the child running as it was", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    const before = await readRecord(fx, id);
    fx.host.inject("saveDevicesState", { fail: "disk full", pid: before.pid });
    await assert.rejects(
      fx.svc.pause(id),
      (e: unknown) => e instanceof ForkdError && /saveDevicesState: disk full/.test(e.message),
    );
    const s = fx.svc.get(id);
    assert.equal(s.state, "running");
    assert.equal(s.transition, null);
    assert.equal(fx.host.process(before.pid)?.status, "running", "its guest runs again");
    assert.equal((await sh(fx, id, "echo alive")).trim(), "alive");
    assert.deepEqual(await readRecord(fx, id), before, "the record is as before");
    assert.deepEqual(await readdir(join(fx.root, id)), ["disk.qcow2", "sandbox.json"], "no image left");
    // And a later pause works.
    assert.equal((await fx.svc.pause(id)).state, "paused");
  });
});

test("a pause that fails after its VMM stopped retires the child (it cannot come back)", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    fx.host.inject("apply", { fail: "no space for the image" });
    await assert.rejects(fx.svc.pause(id), /no space for the image/);
    const s = fx.svc.get(id);
    assert.equal(s.state, "exited");
    assert.match(s.exitReason ?? "", /^pause failed: .*no space for the image/);
    assert.deepEqual(await fx.dirs(), []);
    assert.equal(fx.host.processes().length, 0);
    await assert.rejects(fx.svc.resume(id), (e: unknown) => e instanceof ForkdError && e.code === "conflict");
  });
});

test("a resume that fails (state does not load, or the agent never answers) leaves it paused", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    await fx.svc.pause(id);
    const paused = await readRecord(fx, id);
    fx.host.inject("restore", { fail: "bad device state" });
    await assert.rejects(fx.svc.resume(id), /bad device state/);
    assert.equal(fx.svc.get(id).state, "paused");
    assert.deepEqual(await readRecord(fx, id), paused);
    assert.equal(fx.host.processes().length, 0, "the new VMM was killed");

    fx.host.inject("restore", { silentGuest: true });
    await assert.rejects(fx.svc.resume(id), (e: unknown) => e instanceof ForkdError && e.code === "timeout");
    assert.equal(fx.svc.get(id).state, "paused");
    assert.deepEqual(await readRecord(fx, id), paused, "the record names the paused image again");
    assert.equal(fx.host.processes().length, 0);

    // The record names the new VMM before its guest runs; a resume failing after that is undone.
    fx.host.inject("resume", { fail: "cont refused" });
    await assert.rejects(fx.svc.resume(id), /cont refused/);
    assert.equal(fx.svc.get(id).state, "paused");
    assert.deepEqual(await readRecord(fx, id), paused, "the record written ahead is rolled back");
    assert.equal(fx.host.processes().length, 0);

    assert.equal((await fx.svc.resume(id)).state, "running", "the next try works");
    assert.equal((await sh(fx, id, "echo back")).trim(), "back");
  });
});

test("a VMM that dies in the middle of a pause: the pause fails, the child is reported exited", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    const pid = fx.svc.get(id).record.pid;
    fx.host.inject("saveDevicesState", { run: (p) => fx.host.process(p ?? 0)?.crash(), pid });
    await assert.rejects(fx.svc.pause(id), (e: unknown) => e instanceof ForkdError);
    await until("the child to be retired", () => fx.svc.get(id).state === "exited");
    assert.equal(fx.svc.get(id).exitReason, "vmm process exited");
    assert.equal(fx.svc.get(id).transition, null);
    await until("its files to be gone", async () => (await fx.dirs()).length === 0);
    await assert.rejects(fx.svc.resume(id), (e: unknown) => e instanceof ForkdError && e.code === "conflict");
  });
});

test("a fork where some children fail: siblings run, failures listed by index, their dirs removed", async () => {
  await withSandboxes(async (fx) => {
    fx.host.inject("launch", { fail: "out of VMMs", times: 2 });
    fx.host.inject("restore", { fail: "state did not load" });
    const r = await fx.svc.fork("base", 5);
    assert.equal(r.sandboxes.length, 2);
    assert.equal(r.failures.length, 3);
    assert.deepEqual(
      r.failures.map((f) => f.code),
      ["vmm_error", "vmm_error", "vmm_error"],
    );
    assert.deepEqual(r.failures.map((f) => f.message.replace(/^.*: /, "")).sort(), [
      "out of VMMs",
      "out of VMMs",
      "state did not load",
    ]);
    assert.deepEqual([...r.failures.map((f) => f.index), ...r.sandboxes.map((_, i) => i)].length, 5);
    assert.equal(new Set(r.failures.map((f) => f.index)).size, 3, "each failure names its own child");
    assert.deepEqual(await fx.dirs(), r.sandboxes.map((s) => s.record.id).sort(), "only the siblings' dirs");
    assert.deepEqual(
      (await readdir(fx.root)).filter((n) => n.startsWith(".fanout-")),
      [],
      "the fan-out's journal is gone",
    );
    assert.equal(fx.host.processes().length, 2, "the failed children's VMMs are gone");
    for (const s of r.sandboxes) assert.equal((await sh(fx, s.record.id, "echo ok")).trim(), "ok");
  });
});

test("a VMM that dies in the middle of a BRANCH: the branch fails cleanly, the source is reported exited", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    const pid = fx.svc.get(id).record.pid;
    fx.host.inject("freezeDisk", { run: (p) => fx.host.process(p ?? 0)?.crash(), pid });
    await assert.rejects(fx.svc.branch(id, "br1", true), (e: unknown) => e instanceof ForkdError);
    await until("the source to be retired", () => fx.svc.get(id).state === "exited");
    assert.equal(fx.svc.get(id).exitReason, "vmm process exited");
    assert.equal(await fx.store.has("br1"), false, "no snapshot published");
    assert.equal(await fx.store.pending("br1"), null, "nor left writing");
    assert.deepEqual(
      (await readdir(fx.store.root)).filter((n) => n !== "base"),
      [],
      "no staging left",
    );
    await until("its files to be gone", async () => (await fx.dirs()).length === 0);

    // The tag is free again: a branch of a healthy child takes it, and children fork from it.
    const other = await forkOne(fx);
    const b = await fx.svc.branch(other, "br1", true);
    assert.equal(b.status, "ready");
    assert.equal(fx.svc.get(other).state, "running", "the source runs on");
    const r = await fx.svc.fork("br1", 1);
    assert.deepEqual(r.failures, []);
    assert.equal((await sh(fx, r.sandboxes[0]?.record.id ?? "", "echo child")).trim(), "child");
  });
});

test("disk limit: the first write past it kills the child, with why", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx, { limits: { diskMiB: 1 } });
    const p = fx.host.process(fx.svc.get(id).record.pid);
    assert.ok(p);
    await p.writeDisk(512 * 1024);
    assert.equal(fx.svc.get(id).state, "running", "within its limit");
    await p.writeDisk(768 * 1024);
    await until("the child to be killed", () => fx.svc.get(id).state === "exited");
    assert.equal(fx.svc.get(id).exitReason, "killed by the host: disk limit of 1 MiB exceeded");
    await until(
      "its VMM and files to be gone",
      async () => (await fx.dirs()).length === 0 && fx.host.processes().length === 0,
    );
  });
});

test("the warm pool serves the next fork; a pooled VMM that died is passed over", async () => {
  const fx = await fakeSandboxes({ poolSize: 1 });
  try {
    fx.svc.prewarm("base");
    await until("a VMM to be pre-started", () => fx.svc.poolStatus().base === 1);
    const first = await fx.svc.fork("base", 1);
    assert.equal(first.sandboxes[0]?.record.fromPool, true);
    await until("the pool to be refilled", () => fx.svc.poolStatus().base === 1);
    const running = new Set(fx.svc.list().map((v) => v.record.pid));
    const pooled = fx.host.processes().find((p) => !running.has(p.id.pid));
    assert.ok(pooled);
    await pooled.crash();
    const second = await fx.svc.fork("base", 1);
    assert.deepEqual(second.failures, []);
    assert.equal(second.sandboxes[0]?.record.fromPool, false, "the dead one was not handed out");
    assert.equal((await sh(fx, second.sandboxes[0]?.record.id ?? "", "echo fresh")).trim(), "fresh");
  } finally {
    await fx.cleanup();
  }
});
