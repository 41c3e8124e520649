/**
 * Recovery without VMs: sandbox records parsed with their schema (a corrupt one quarantined, a
 * missing one removed), a pause cut short finished from what it saved, an unclaimed fan-out's
 * children given a short idle timeout, corrupt snapshot metadata quarantined, and strays
 * killed only when their executable is forkd's.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, realpath, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { loadRecord } from "../../src/sandbox/record.js";
import { UNCLAIMED_IDLE_MS, strayImages } from "../../src/sandbox/recovery.js";
import type { SandboxRecord } from "../../src/sandbox/sandbox.js";
import { SandboxService } from "../../src/sandbox/service.js";
import { SnapshotStore } from "../../src/snapshot/store.js";
import { crashPointFromEnv } from "../../src/util/crash.js";
import { isAlive } from "../../src/util/proc.js";
import { Quarantine } from "../../src/util/quarantine.js";
import { QemuDriver } from "../../src/vmm/qemu.js";
import type { VmmDriver } from "../../src/vmm/driver.js";
import { Strays } from "../../src/vmm/strays.js";
import { fakeSnapshot } from "../helpers/snapshots.js";

const ID = "sb-abcdefghijklmnop";
const ID2 = "sb-bcdefghijklmnopq";
const ID3 = "sb-cdefghijklmnopqr";

function logger(): { lines: string[]; log: { info: () => void; warn: (m: string) => void } } {
  const lines: string[] = [];
  return { lines, log: { info: () => undefined, warn: (m: string) => void lines.push(m) } };
}

function record(dir: string, over: Partial<SandboxRecord> = {}): SandboxRecord {
  return {
    format: 1,
    id: ID,
    tag: "base",
    // This process, with a start time it does not have: a VMM that is gone.
    pid: process.pid,
    pidStartTime: 1,
    created: new Date().toISOString(),
    timings: { launchMs: 1, restoreMs: 1, readyMs: 1, totalMs: 3 },
    fromPool: false,
    timeoutMs: null,
    metadata: {},
    onIdle: "kill",
    owner: null,
    ...over,
  };
}

const paused = (dir: string) => ({
  pausedAt: new Date().toISOString(),
  memory: join(dir, "paused-1", "memory"),
  vmstate: join(dir, "paused-1", "vmstate"),
  disk: join(dir, "disk.qcow2"),
  machine: { memoryMiB: 128, vcpus: 1, accel: "tcg" as const, cpu: "qemu64" },
});

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-recover-"));
  try {
    await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

test("a sandbox record is parsed with its schema", async () => {
  await withDir(async (root) => {
    const dir = join(root, ID);
    await mkdir(dir);
    assert.equal((await loadRecord(dir, ID)).kind, "missing");
    const write = (v: unknown) =>
      writeFile(join(dir, "sandbox.json"), typeof v === "string" ? v : JSON.stringify(v));
    await write(record(dir));
    const ok = await loadRecord(dir, ID);
    assert.equal(ok.kind, "ok");
    // Unknown top-level fields (a later version's) survive.
    await write({ ...record(dir), later: { x: 1 } });
    const later = await loadRecord(dir, ID);
    assert.ok(later.kind === "ok" && (later.record as unknown as { later: unknown }).later);
    const bad: Array<[unknown, RegExp]> = [
      ['{"format": 1,', /not JSON/],
      [{ ...record(dir), pid: "12" }, /invalid record/],
      [{ ...record(dir), format: 2 }, /invalid record/],
      [{ ...record(dir), id: ID2 }, /not sb-/],
      [{ ...record(dir), paused: { ...paused(dir), memory: "/etc/passwd" } }, /outside its directory/],
      [{ ...record(dir), memoryFile: `${dir}/../${ID2}/paused-1/memory` }, /outside its directory/],
      [{ ...record(dir), network: { mode: "bogus" } }, /invalid record/],
    ];
    for (const [v, why] of bad) {
      await write(v);
      const r = await loadRecord(dir, ID);
      assert.equal(r.kind, "corrupt", JSON.stringify(v));
      assert.match(r.kind === "corrupt" ? r.reason : "", why);
    }
  });
});

test("recovery quarantines a corrupt record, removes an unfinished fork, finishes a pause, marks unclaimed children", async () => {
  await withDir(async (data) => {
    const root = join(data, "sandboxes");
    const store = new SnapshotStore(join(data, "snapshots"));
    await mkdir(store.root, { recursive: true });
    await fakeSnapshot(store, "base", null);
    const { lines, log } = logger();
    const svc = new SandboxService({
      root,
      store,
      driver: new QemuDriver("/bin/false"),
      log,
      strays: new Strays([], log),
    });
    // A corrupt record, an unfinished fork (no record), a pause cut short after its memory image
    // was built, and a paused child of a fan-out whose reply was never sent.
    for (const id of [ID, ID2, ID3, "sb-defghijklmnopqrs"])
      await mkdir(join(root, id, "paused-1"), { recursive: true });
    await writeFile(join(root, ID, "sandbox.json"), "{ garbage");
    const d3 = join(root, ID3);
    const p3 = paused(d3);
    await writeFile(p3.memory, "memory");
    await writeFile(p3.vmstate, "devices");
    await writeFile(join(d3, "paused-1", "memory.diff"), "diff");
    await mkdir(join(d3, "paused-0")); // an older pause's image no record names
    await writeFile(
      join(d3, "sandbox.json"),
      JSON.stringify(
        record(d3, {
          id: ID3,
          network: {
            mode: "none",
            egress: { mode: "deny", allow: [], dns: false },
            expose: [],
            guestIp: null,
            slot: 3,
            ports: {},
          },
          paused: {
            ...p3,
            pending: { diff: join(d3, "paused-1", "memory.diff"), base: store.filesFor("base").memory },
          },
        }),
      ),
    );
    const d4 = join(root, "sb-defghijklmnopqrs");
    const p4 = paused(d4);
    await writeFile(p4.memory, "memory");
    await writeFile(
      join(d4, "sandbox.json"),
      JSON.stringify(
        record(d4, { id: "sb-defghijklmnopqrs", paused: p4, fanout: "f1", timeoutMs: 3_600_000 }),
      ),
    );
    await writeFile(join(root, ".fanout-f1"), "");
    await writeFile(join(root, ".fanout-gone"), "");

    const r = await svc.recover();
    assert.deepEqual(r.quarantined, [ID]);
    assert.deepEqual(r.removed, [ID2]);
    assert.deepEqual(r.adopted.sort(), [ID3, "sb-defghijklmnopqrs"]);
    assert.ok(lines.includes("recover: quarantined unreadable state"));
    const q = await readdir(join(data, "quarantine"));
    assert.equal(q.length, 1);
    assert.match(q[0] ?? "", new RegExp(`^sandbox-${ID}-`));
    assert.equal(await readFile(join(data, "quarantine", q[0] ?? "", "sandbox.json"), "utf8"), "{ garbage");
    assert.deepEqual(
      (await readdir(root)).sort(),
      [ID3, "sb-defghijklmnopqrs"],
      "journals and the fork's dir are gone",
    );

    // The pause is finished: image complete, no diff, slot given back; the stray image is gone.
    assert.equal(svc.get(ID3).state, "paused");
    const rec3 = JSON.parse(await readFile(join(d3, "sandbox.json"), "utf8")) as SandboxRecord;
    assert.equal(rec3.paused?.pending, undefined);
    assert.equal(rec3.network?.slot, null);
    assert.deepEqual((await readdir(d3)).sort(), ["paused-1", "sandbox.json"]);
    assert.deepEqual((await readdir(join(d3, "paused-1"))).sort(), ["memory", "vmstate"]);

    // The unclaimed child: a short idle timeout, written down.
    const v4 = svc.get("sb-defghijklmnopqrs");
    assert.equal(v4.record.timeoutMs, UNCLAIMED_IDLE_MS);
    const rec4 = JSON.parse(await readFile(join(d4, "sandbox.json"), "utf8")) as SandboxRecord;
    assert.equal(rec4.timeoutMs, UNCLAIMED_IDLE_MS);
    assert.equal(rec4.fanout, undefined);
    await svc.killAll();
  });
});

test("a paused image no record names is a stray; the one in use is not", async () => {
  await withDir(async (dir) => {
    for (const n of ["paused-a", "paused-b", "paused-c", "other"]) await mkdir(join(dir, n));
    const r = record(dir, {
      memoryFile: join(dir, "paused-a", "memory"),
      paused: { ...paused(dir), memory: join(dir, "paused-b", "memory") },
    });
    assert.deepEqual(await strayImages(dir, r), [join(dir, "paused-c")]);
  });
});

test("snapshot recovery quarantines unreadable metadata and failure records", async () => {
  await withDir(async (data) => {
    const store = new SnapshotStore(join(data, "snapshots"));
    await mkdir(store.root);
    await fakeSnapshot(store, "good", null);
    await fakeSnapshot(store, "bad", null);
    await writeFile(store.filesFor("bad").meta, '{"format": 1}');
    await writeFile(join(store.root, ".failed-x.json"), "nope");
    await mkdir(join(store.root, ".staging-y"));
    await writeFile(
      join(store.root, ".staging-y", "status.json"),
      JSON.stringify({ tag: "y", started: "t", source: null }),
    );
    const { lines, log } = logger();
    await store.recover(new Quarantine(join(data, "quarantine"), log));
    assert.deepEqual(
      (await store.list()).map((m) => m.tag),
      ["good"],
    );
    const q = (await readdir(join(data, "quarantine"))).sort();
    assert.equal(q.length, 2);
    assert.match(q[0] ?? "", /^failed-record-\.failed-x\.json-/);
    assert.match(q[1] ?? "", /^snapshot-bad-/);
    assert.equal(lines.filter((l) => l === "recover: quarantined unreadable state").length, 2);
    // The interrupted write reads failed.
    assert.equal((await store.pending("y"))?.status, "failed");
  });
});

test("strays: only processes whose executable is forkd's are killed", async () => {
  await withDir(async (dir) => {
    const child = spawn("/bin/sh", ["-c", "sleep 60", `${dir}/qmp.sock`], { stdio: "ignore" });
    const pid = child.pid ?? 0;
    const exited = new Promise((r) => child.once("exit", r));
    try {
      await new Promise((r) => setTimeout(r, 100));
      const { log } = logger();
      assert.deepEqual(
        await new Strays([], log).kill([`${dir}/`], "test"),
        [],
        "not a forkd program: left alone",
      );
      assert.ok(isAlive(pid));
      const sh = await realpath("/bin/sh");
      assert.deepEqual(await new Strays([sh], log).kill([`${dir}-other/`], "test"), [], "another directory");
      assert.deepEqual(await new Strays([sh], log).kill([`${dir}/`], "test"), [pid]);
      await exited;
    } finally {
      child.kill("SIGKILL");
    }
  });
});

test("FORKD_TEST_CRASH_AT names a known point or is refused", () => {
  assert.doesNotThrow(() => crashPointFromEnv({})("pause:saved"));
  assert.doesNotThrow(() => crashPointFromEnv({ FORKD_TEST_CRASH_AT: "pause:saved" })("resume:launched"));
  assert.throws(() => crashPointFromEnv({ FORKD_TEST_CRASH_AT: "pause:nowhere" }), /unknown point/);
});

test("DELETE during a resume waits for it, then nothing of the sandbox is left", async () => {
  await withDir(async (data) => {
    const root = join(data, "sandboxes");
    const store = new SnapshotStore(join(data, "snapshots"));
    await mkdir(store.root, { recursive: true });
    await fakeSnapshot(store, "base", null);
    const dir = join(root, ID);
    const p = paused(dir);
    await mkdir(join(dir, "paused-1"), { recursive: true });
    await writeFile(p.memory, "memory");
    await writeFile(p.vmstate, "devices");
    await writeFile(join(dir, "sandbox.json"), JSON.stringify(record(dir, { paused: p })));
    // A VMM launch that takes as long as the test says.
    let fail: (e: Error) => void = () => undefined;
    let launched: () => void = () => undefined;
    const started = new Promise<void>((r) => (launched = r));
    const driver = {
      binary: "/bin/false",
      launch: () => {
        launched();
        return new Promise((_, reject) => (fail = reject));
      },
    } as unknown as VmmDriver;
    const { log } = logger();
    const svc = new SandboxService({ root, store, driver, log, strays: new Strays([], log) });
    await svc.recover();
    assert.equal(svc.get(ID).state, "paused");
    const resuming = svc.resume(ID).then(
      () => "resumed",
      (e: unknown) => String(e),
    );
    await started;
    let killed = false;
    const killing = svc.kill(ID).then(() => (killed = true));
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(killed, false, "kill waits for the resume in progress");
    assert.throws(() => svc.get(ID), /no sandbox/, "but the sandbox is gone from the API at once");
    fail(new Error("QEMU did not come up"));
    await killing;
    assert.match(await resuming, /did not come up/);
    assert.deepEqual(await readdir(root), [], "its directory is gone when kill returns");
    await svc.killAll();
  });
});
