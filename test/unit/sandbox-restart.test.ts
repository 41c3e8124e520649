/**
 * A daemon restart on the fake VMM: the new daemon's SandboxService.recover() adopts what still
 * runs (and what is paused), and cleans up the rest: a record whose VMM died, a record whose pid
 * is now another process's, a directory without a record, a record that does not parse
 * (quarantined), a VMM whose agent does not answer. Nothing is left running that no one owns.
 */
import assert from "node:assert/strict";
import { readdir, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import type { SandboxRecord } from "../../src/sandbox/sandbox.js";
import { fakeSandboxes, until } from "../helpers/fake-sandboxes.js";
import type { FakeSandboxes } from "../helpers/fake-sandboxes.js";

const sh = async (fx: FakeSandboxes, id: string, cmd: string): Promise<string> =>
  fx.svc.use(id, async (agent) => {
    const out: Buffer[] = [];
    const r = await agent.exec({ shell: cmd }, { onStdout: (d) => out.push(d) }).result;
    assert.equal(r.exitCode, 0);
    return Buffer.concat(out).toString();
  });

const recordFile = (fx: FakeSandboxes, id: string) => join(fx.root, id, "sandbox.json");
const readRecord = async (fx: FakeSandboxes, id: string): Promise<SandboxRecord> =>
  JSON.parse(await readFile(recordFile(fx, id), "utf8")) as SandboxRecord;

test("a restarted daemon adopts running and paused sandboxes, which go on working", async () => {
  const fx = await fakeSandboxes();
  try {
    const r = await fx.svc.fork("base", 2, { timeoutMs: 3_600_000 });
    const [a, b] = r.sandboxes.map((s) => s.record.id);
    assert.ok(a && b);
    const scratch = fx.host.process(fx.svc.get(a).record.pid)?.guest?.dir;
    await sh(fx, a, `echo before > ${scratch}/f`);
    await fx.svc.pause(b);
    const pidA = fx.svc.get(a).record.pid;

    const svc = await fx.restart();
    const rec = await svc.recover();
    assert.deepEqual(rec.adopted.sort(), [a, b].sort());
    assert.deepEqual(rec.removed, []);
    assert.deepEqual(rec.quarantined, []);
    assert.equal(svc.get(a).state, "running");
    assert.equal(svc.get(a).record.pid, pidA, "the same VMM process");
    assert.equal(svc.get(a).record.timeoutMs, 3_600_000, "its settings kept");
    assert.equal((await sh(fx, a, `cat ${scratch}/f`)).trim(), "before");
    assert.equal(svc.get(b).state, "paused");
    assert.equal((await svc.resume(b)).state, "running");
    assert.equal((await sh(fx, b, "echo resumed")).trim(), "resumed");

    // The new daemon hears of its exit; the old one (detached) does nothing to its files.
    await fx.host.process(pidA)?.crash();
    await until("the new daemon to see the exit", () => svc.get(a).state === "exited");
    assert.equal(svc.get(a).exitReason, "vmm process exited");
  } finally {
    await fx.cleanup();
  }
});

test("recovery removes stale records, quarantines corrupt ones, and kills the VMMs no one can own", async () => {
  const fx = await fakeSandboxes();
  try {
    const r = await fx.svc.fork("base", 6);
    assert.deepEqual(r.failures, []);
    const [dead, reused, owner, missing, corrupt, silent] = r.sandboxes.map((s) => s.record.id) as [
      string,
      string,
      string,
      string,
      string,
      string,
    ];
    const pid = (id: string) => fx.svc.get(id).record.pid;
    const pids = Object.fromEntries(r.sandboxes.map((s) => [s.record.id, pid(s.record.id)]));
    await fx.restart();

    // While no daemon runs: one VMM dies; one record's pid is now another VMM's (a reused pid,
    // its start time differs); one record is lost (the daemon died before writing it), one is
    // garbage; one VMM's agent will not answer.
    await fx.host.process(pids[dead]!)?.crash();
    const ownerRec = await readRecord(fx, owner);
    await writeFile(
      recordFile(fx, reused),
      JSON.stringify({
        ...(await readRecord(fx, reused)),
        pid: ownerRec.pid,
        pidStartTime: ownerRec.pidStartTime + 1,
      }),
    );
    await rm(recordFile(fx, missing));
    await writeFile(recordFile(fx, corrupt), "{ not json");
    fx.host.inject("connectAgent", { fail: "no agent", pid: pids[silent] });

    const rec = await fx.svc.recover();
    assert.deepEqual(rec.adopted, [owner]);
    assert.deepEqual(rec.removed.sort(), [dead, reused, missing, silent].sort());
    assert.deepEqual(rec.quarantined, [corrupt]);

    assert.deepEqual(
      fx.host.processes().map((p) => p.id.pid),
      [pids[owner]],
      "only the adopted sandbox's VMM runs: the others were killed, the owner's was not",
    );
    assert.deepEqual(await fx.dirs(), [owner]);
    const q = await readdir(join(fx.data, "quarantine"));
    assert.equal(q.length, 1);
    assert.match(q[0] ?? "", new RegExp(`^sandbox-${corrupt}-`));
    assert.equal(
      await readFile(join(fx.data, "quarantine", q[0] ?? "", "sandbox.json"), "utf8"),
      "{ not json",
    );
    assert.ok(fx.warnings.includes("recover: removing a sandbox whose creation did not finish"));
    assert.ok(fx.warnings.includes("killing a process a dead daemon left behind"));
    assert.equal((await sh(fx, owner, "echo still here")).trim(), "still here");
    for (const id of [dead, reused, missing, silent, corrupt])
      assert.throws(() => fx.svc.get(id), /no sandbox/);
  } finally {
    await fx.cleanup();
  }
});
