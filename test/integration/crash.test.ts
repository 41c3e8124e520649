/**
 * kill -9 at every step of create, fork, branch, pause, resume and unpack (the daemon's test-only
 * crash points, FORKD_TEST_CRASH_AT), then a restart: 0 lost sandboxes (a paused one resumes with
 * its files, a running one answers), 0 orphaned processes (nothing referencing the data dir that
 * the new daemon does not own), 0 half-written snapshots listed ready. Also DELETE during a pause
 * and a resume, and a corrupt sandbox record quarantined while the daemon starts. One daemon,
 * one small snapshot, restarted between cases.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { readdir, readFile, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { ApiError } from "../helpers/http.js";
import { processCmdline } from "../../src/util/proc.js";
import type { CrashPointName } from "../../src/util/crash.js";
import { api, forkOne, sh } from "../helpers/vm.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { steps } from "../helpers/steps.js";

const { step, failed } = steps();
let d: TestDaemon;
/** The sandbox every case works on, and what it wrote. */
let a = "";
let note = 0;

interface View {
  id: string;
  state: string;
  pid: number;
  timeout_ms: number | null;
}

before(async () => {
  // No pre-started VMMs: every QEMU process of the data dir is then a listed sandbox's.
  d = await makeDaemon({ FORKD_POOL_SIZE: "0" });
});

after(async () => {
  await d.destroy(failed());
});

const call = <T>(method: string, path: string, body?: unknown) => api<T>(d, method, path, body);
const list = async () => (await call<{ sandboxes: View[] }>("GET", "/v1/sandboxes")).sandboxes;
const isNotFound = (e: unknown) => e instanceof ApiError && e.code === "not_found";

/** Restarts the daemon (kill -9 first if it runs) with FORKD_TEST_CRASH_AT set or not. */
async function restart(point?: CrashPointName): Promise<void> {
  if (d.proc.exitCode === null && d.proc.signalCode === null) await d.kill9();
  if (point) d.env.FORKD_TEST_CRASH_AT = point;
  else delete d.env.FORKD_TEST_CRASH_AT;
  await d.start();
}

/** Arms `point`, runs `action` (which the daemon dies in), and restarts the daemon unarmed. */
async function crashDuring(point: CrashPointName, action: () => Promise<unknown>): Promise<void> {
  await restart(point);
  const proc = d.proc;
  const exited = new Promise<void>((r) => proc.once("exit", () => r()));
  await assert.rejects(action(), `the daemon dies at ${point}`);
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    exited,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`the daemon did not die at ${point}`)), 60_000);
    }),
  ]).finally(() => clearTimeout(timer));
  assert.equal(proc.signalCode, "SIGKILL", `killed at ${point}`);
  await restart();
}

/** Processes mentioning the data dir that no listed running sandbox owns. */
async function orphans(): Promise<string[]> {
  const owned = new Set((await list()).filter((v) => v.state === "running").map((v) => v.pid));
  const out: string[] = [];
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name) || owned.has(Number(name))) continue;
    const cmd = await processCmdline(Number(name));
    if (cmd.some((x) => x.includes(d.dataDir))) out.push(`${name}: ${cmd.slice(0, 3).join(" ")}`);
  }
  return out;
}

/** Every snapshot listed is whole (verified by the daemon), and no staging directory is left. */
async function snapshotsWhole(): Promise<string[]> {
  const tags = (await call<{ snapshots: { tag: string }[] }>("GET", "/v1/snapshots")).snapshots.map(
    (s) => s.tag,
  );
  for (const t of tags) {
    const got = await call<{ tag?: string; status?: string }>("GET", `/v1/snapshots/${t}`);
    assert.equal(got.tag, t, `${t} listed and readable`);
    assert.ok(got.status === undefined || got.status === "ready", `${t} is ready when listed`);
  }
  const staging = (await readdir(join(d.dataDir, "snapshots"))).filter((n) => n.startsWith(".staging-"));
  assert.deepEqual(staging, [], "no staging directory left");
  return tags;
}

/** The invariants after every crash; `a` is running or paused with its latest note. */
async function intact(): Promise<void> {
  assert.deepEqual(await orphans(), [], "no orphaned process");
  await snapshotsWhole();
  const v = await call<View>("GET", `/v1/sandboxes/${a}`);
  if (v.state === "paused") await call("POST", `/v1/sandboxes/${a}/resume`);
  else assert.equal(v.state, "running");
  assert.equal(await sh(d, a, "cat /root/note"), `${note}\n`, "its files are there");
  note++;
  await sh(d, a, `echo ${note} > /root/note`);
  assert.deepEqual(await orphans(), [], "no orphaned process after the resume");
}

/** A snapshot tag a crash interrupted: failed (and cleaned) or absent, never ready. */
async function notReady(tag: string): Promise<void> {
  try {
    const st = await call<{ status?: string }>("GET", `/v1/snapshots/${tag}`);
    assert.equal(st.status, "failed", `${tag} reads failed`);
    await assert.rejects(
      call("POST", "/v1/sandboxes", { snapshot_tag: tag, n: 1 }),
      (e: unknown) => e instanceof ApiError && e.code === "conflict",
    );
    await call("DELETE", `/v1/snapshots/${tag}`);
  } catch (e) {
    if (!isNotFound(e)) throw e;
  }
  assert.ok(!(await snapshotsWhole()).includes(tag), `${tag} is not listed`);
}

step("a small snapshot and a sandbox that writes a file", async () => {
  await call("POST", "/v1/snapshots", { tag: "base", memory_mib: 256 });
  a = await forkOne(d, "base");
  await sh(d, a, `echo ${note} > /root/note`);
});

for (const point of ["pause:saved", "pause:recorded", "pause:after-stop", "pause:before-record"] as const) {
  step(`kill -9 at ${point}: the sandbox is kept (running, or paused with its state)`, async () => {
    await crashDuring(point, () => call("POST", `/v1/sandboxes/${a}/pause`));
    await intact();
  });
}

for (const point of ["resume:launched", "resume:recorded"] as const) {
  step(`kill -9 at ${point}: the sandbox is kept, one VMM at most`, async () => {
    await call("POST", `/v1/sandboxes/${a}/pause`);
    await crashDuring(point, () => call("POST", `/v1/sandboxes/${a}/resume`));
    const v = await call<View>("GET", `/v1/sandboxes/${a}`);
    assert.equal(v.state, point === "resume:launched" ? "paused" : "running");
    await intact();
  });
}

for (const point of ["branch:paused", "branch:before-publish"] as const) {
  step(`kill -9 at ${point}: the branch is failed, the source runs on`, async () => {
    const tag = point.replace(":", "-");
    await crashDuring(point, () => call("POST", `/v1/sandboxes/${a}/branch`, { tag, wait: true }));
    await notReady(tag);
    await intact();
  });
}

step("kill -9 before a fork's records are written: its children are gone", async () => {
  await crashDuring("fork:before-record", () =>
    call("POST", "/v1/sandboxes", { snapshot_tag: "base", n: 2 }),
  );
  assert.deepEqual(
    (await list()).map((v) => v.id),
    [a],
  );
  const dirs = (await readdir(join(d.dataDir, "sandboxes"))).filter((n) => n.startsWith("sb-"));
  assert.deepEqual(dirs, [a], "no directory of theirs is left");
  await intact();
});

step("kill -9 before a fork's reply: its children are adopted unclaimed (short idle timeout)", async () => {
  await crashDuring("fork:after-record", () =>
    call("POST", "/v1/sandboxes", { snapshot_tag: "base", n: 2, timeout_ms: 3_600_000 }),
  );
  const others = (await list()).filter((v) => v.id !== a);
  assert.equal(others.length, 2);
  for (const v of others) {
    assert.equal(v.state, "running");
    assert.equal(v.timeout_ms, 300_000, "an unclaimed sandbox gets a short idle timeout");
    assert.equal(await sh(d, v.id, "echo up"), "up\n");
    await call("DELETE", `/v1/sandboxes/${v.id}`);
  }
  assert.equal(
    (await call<View>("GET", `/v1/sandboxes/${a}`)).timeout_ms,
    null,
    "a claimed one keeps its own",
  );
  const journals = (await readdir(join(d.dataDir, "sandboxes"))).filter((n) => n.startsWith("."));
  assert.deepEqual(journals, [], "no fan-out journal left");
  await intact();
});

for (const point of ["create:booted", "create:before-publish"] as const) {
  step(`kill -9 at ${point}: no parent VM survives, the tag is failed`, async () => {
    const tag = point.replace(":", "-");
    await crashDuring(point, () => call("POST", "/v1/snapshots", { tag, memory_mib: 256 }));
    await notReady(tag);
    const run = await readdir(join(d.dataDir, "run"));
    assert.deepEqual(run, [], "run/ is empty");
    await intact();
  });
}

step("kill -9 during a pack and an unpack: nothing is published, nothing staged", async () => {
  await call("POST", `/v1/sandboxes/${a}/branch`, { tag: "pk" });
  const file = join(d.dataDir, "pk.forkd.tar.zst");
  const packed = await cli(d, ["pack", "pk", "-o", file]);
  assert.equal(packed.code, 0, packed.stderr);
  await crashDuring("pack:streaming", async () => {
    const r = await cli(d, ["pack", "pk", "-o", `${file}.again`]);
    if (r.code !== 0) throw new Error(r.stderr);
  });
  assert.deepEqual(await orphans(), [], "no orphaned process");
  await snapshotsWhole();
  await call("DELETE", "/v1/snapshots/pk");
  for (const point of ["unpack:extracted", "unpack:before-publish"] as const) {
    await crashDuring(point, async () => {
      const r = await cli(d, ["unpack", file]);
      if (r.code !== 0) throw new Error(r.stderr);
    });
    await notReady("pk");
    assert.deepEqual(await orphans(), [], "no orphaned process");
  }
  const r = await cli(d, ["unpack", file]);
  assert.equal(r.code, 0, r.stderr);
  const g = await forkOne(d, "pk");
  assert.equal(await sh(d, g, "cat /root/note"), `${note}\n`);
  await call("DELETE", `/v1/sandboxes/${g}`);
  await intact();
});

step("DELETE during a pause answers 200 and leaves nothing behind", async () => {
  const b = await forkOne(d, "base");
  const pausing = call("POST", `/v1/sandboxes/${b}/pause`).then(
    () => "paused",
    (e: unknown) => (e instanceof Error ? e.message : String(e)),
  );
  // The pause is under way once an exec is refused for it.
  for (let i = 0; ; i++) {
    const r = await call("POST", `/v1/sandboxes/${b}/exec`, { cmd: "true" }).then(
      () => "ran",
      (e: unknown) => (e instanceof ApiError ? e.message : String(e)),
    );
    // Refused while it is paused, or cut off as it detaches the agent (an exec in flight).
    if (/being paused|closed by host/.test(r)) break;
    assert.ok(i < 200 && r === "ran", `the pause is seen under way (${r})`);
    await new Promise((res) => setTimeout(res, 10));
  }
  await call("DELETE", `/v1/sandboxes/${b}`);
  await pausing;
  await assert.rejects(call("GET", `/v1/sandboxes/${b}`), isNotFound);
  await assert.rejects(stat(join(d.dataDir, "sandboxes", b)), "its directory is gone");
  assert.deepEqual(await orphans(), []);
});

step("DELETE during a resume answers 200 and leaves nothing behind", async () => {
  const b = await forkOne(d, "base");
  await call("POST", `/v1/sandboxes/${b}/pause`);
  const resuming = call("POST", `/v1/sandboxes/${b}/resume`).then(
    () => "resumed",
    (e: unknown) => (e instanceof Error ? e.message : String(e)),
  );
  // The resume is under way once a second one is refused for it.
  for (let i = 0; ; i++) {
    const r = await call("POST", `/v1/sandboxes/${b}/resume`).then(
      () => "resumed",
      (e: unknown) => (e instanceof ApiError ? e.message : String(e)),
    );
    if (/being resumed/.test(r)) break;
    assert.ok(i < 200 && !/not paused/.test(r), `the resume is seen under way (${r})`);
    await new Promise((res) => setTimeout(res, 10));
  }
  await call("DELETE", `/v1/sandboxes/${b}`);
  await resuming;
  await assert.rejects(call("GET", `/v1/sandboxes/${b}`), isNotFound);
  await assert.rejects(stat(join(d.dataDir, "sandboxes", b)), "its directory is gone");
  assert.deepEqual(await orphans(), []);
});

step("a corrupt sandbox record is quarantined with a log line; the daemon starts", async () => {
  const b = await forkOne(d, "base");
  await d.kill9();
  await writeFile(join(d.dataDir, "sandboxes", b, "sandbox.json"), '{"format": 1, "id": "nonsense"');
  await restart();
  await assert.rejects(call("GET", `/v1/sandboxes/${b}`), isNotFound);
  const kept = (await readdir(join(d.dataDir, "quarantine"))).filter((n) => n.startsWith(`sandbox-${b}-`));
  assert.equal(kept.length, 1, "moved to quarantine");
  assert.match(await readFile(join(d.dataDir, "daemon.log"), "utf8"), /quarantined unreadable state/);
  assert.deepEqual(await orphans(), [], "its VMM was stopped");
  await intact();
});
