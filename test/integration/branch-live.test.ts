/**
 * A live BRANCH (FORKD_BRANCH_LIVE=on: QEMU's precopy into forkd-memsnap live, src/vmm/live-capture.ts)
 * end to end: grandchildren of a branch taken while the source writes see the state of the
 * pause (memory written by a busy loop, Python globals, files synced and unsynced); the source
 * runs on; a daemon killed while QEMU holds the source stopped at the switchover (or after the
 * capture, before the resume) recovers: the source runs again and the tag is failed, cleaned.
 * The page-by-page proof against a stopped capture is in qemu-driver.test.ts.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { ApiError } from "../helpers/http.js";
import { checkedRequest } from "../helpers/contract.js";
import { steps } from "../helpers/steps.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";

let d: TestDaemon;
const { step, failed } = steps();
let src = "";
let blobHash = "";
let before0 = 0;

interface ExecOut {
  exit_code: number | null;
  stdout: string;
  stderr: string;
}
interface BranchOut {
  tag: string;
  status: string;
  pause_ms: number;
  private_bytes: number;
}

const api = <T>(method: string, path: string, body?: unknown, timeoutMs?: number) =>
  checkedRequest<T>(d.ep, method, path, body, timeoutMs);
const sh = async (id: string, cmd: string) => {
  const r = await api<ExecOut>("POST", `/v1/sandboxes/${id}/exec`, { cmd });
  assert.equal(r.exit_code, 0, `${cmd}: ${r.stderr}`);
  return r.stdout;
};
const py = async (id: string, code: string) => {
  const r = await api<{ value: string | null; error: { traceback: string } | null }>(
    "POST",
    `/v1/sandboxes/${id}/eval`,
    // TCG on a shared 2-core host: a 40 MiB urandom and its hash can take a while.
    { code, timeout_ms: 600_000 },
    700_000,
  );
  assert.equal(r.error, null, r.error?.traceback);
  return r.value;
};
const fork = async (tag: string, n: number) =>
  (
    await api<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", { snapshot_tag: tag, n })
  ).sandboxes.map((s) => s.id);
/**
 * The busy loop's counter. `echo $i > file` truncates before it writes, so a read can find the
 * file empty between the two (also in a grandchild resumed at that instant): read until a value.
 */
const counter = async (id: string): Promise<number> => {
  for (let i = 0; ; i++) {
    const v = (await sh(id, "cat /dev/shm/counter")).trim();
    if (v !== "" || i >= 50) return Number(v);
    await new Promise((res) => setTimeout(res, 20));
  }
};
/** Whether the busy loop counts on in `id`: its counter moves past `from` within a while. */
async function countsOn(id: string, from: number): Promise<boolean> {
  for (let i = 0; i < 40; i++) {
    if ((await counter(id)) > from) return true;
    await new Promise((res) => setTimeout(res, 250));
  }
  return false;
}

/** Restarts the daemon after a kill -9 with FORKD_TEST_CRASH_AT set or not. */
async function restart(point?: string): Promise<void> {
  await d.kill9().catch(() => undefined);
  if (point) d.env.FORKD_TEST_CRASH_AT = point;
  else delete d.env.FORKD_TEST_CRASH_AT;
  await d.start();
}

before(async () => {
  d = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_BRANCH_LIVE: "on" });
});

after(async () => {
  await d.destroy(failed());
});

step("a source child writes memory from a busy loop, files synced and unsynced, Python globals", async () => {
  await api(
    "POST",
    "/v1/snapshots",
    { tag: "base", memory_mib: 384, warm_eval: "import os, hashlib" },
    900_000,
  );
  src = (await fork("base", 1))[0] ?? "";
  assert.ok(src);
  await sh(src, "echo synced > /root/synced.txt && sync");
  await sh(src, "echo unsynced > /root/unsynced.txt");
  await sh(
    src,
    "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /dev/shm/counter; done' >/dev/null 2>&1 < /dev/null &",
  );
  await py(src, "progress = [1, 2, 3]");
  blobHash = (await py(src, "blob = os.urandom(40 << 20)\nhashlib.sha256(blob).hexdigest()")) ?? "";
  assert.match(blobHash, /^'[0-9a-f]{64}'$/);
});

step("a live branch: the source runs on; grandchildren see the state of the pause", async () => {
  before0 = await counter(src);
  const r = await api<BranchOut>("POST", `/v1/sandboxes/${src}/branch`, { tag: "live1" });
  assert.equal(r.status, "ready");
  assert.ok(r.private_bytes >= 40 << 20, `private bytes ${r.private_bytes} include the blob`);
  assert.ok(r.pause_ms > 0);
  assert.ok(await countsOn(src, before0), "the source's loop runs on");
  // The source changes after the branch: none of it reaches the branch.
  await sh(src, "echo later > /root/unsynced.txt && echo later > /root/synced.txt && sync");
  await py(src, "progress.append(4); blob = b''");
  const kids = await fork("live1", 2);
  for (const g of kids) {
    assert.equal(await sh(g, "cat /root/synced.txt"), "synced\n");
    assert.equal(await sh(g, "cat /root/unsynced.txt"), "unsynced\n");
    assert.equal(await py(g, "progress"), "[1, 2, 3]");
    assert.equal(await py(g, "hashlib.sha256(blob).hexdigest()"), blobHash);
    // The loop was running at the pause: it runs on in each grandchild, from no earlier value
    // than the source had before the branch.
    const c1 = await counter(g);
    assert.ok(c1 >= before0, `the counter (${c1}) is not older than before the branch (${before0})`);
    assert.ok(await countsOn(g, c1), "the busy loop runs in the grandchild");
    // Read back from the disk (page cache dropped): the layer frozen at the pause, plus what the
    // grandchild wrote back from its inherited dirty pages.
    assert.equal(
      await sh(g, "sync && echo 3 > /proc/sys/vm/drop_caches && cat /root/synced.txt /root/unsynced.txt"),
      "synced\nunsynced\n",
    );
  }
  await Promise.all(kids.map((g) => api("DELETE", `/v1/sandboxes/${g}`)));
  assert.equal(await py(src, "progress"), "[1, 2, 3, 4]");
});

for (const point of ["branch:live-stopped", "branch:paused"]) {
  step(`a daemon killed at ${point}: the source runs again, the tag is failed and cleaned`, async () => {
    await restart(point);
    await sh(src, `echo ${point} > /root/unsynced.txt`);
    await api<BranchOut>("POST", `/v1/sandboxes/${src}/branch`, { tag: "crashed", wait: false }).catch(
      () => undefined,
    );
    await restart();
    const st = await api<{ status: string }>("GET", "/v1/snapshots/crashed");
    assert.equal(st.status, "failed");
    await assert.rejects(fork("crashed", 1), (e: unknown) => e instanceof ApiError && e.code === "conflict");
    await api("DELETE", "/v1/snapshots/crashed");
    const left = (await readdir(join(d.dataDir, "snapshots"))).filter((n) => n.startsWith(".staging-"));
    assert.deepEqual(left, [], "no partial files remain");
    // The source survived, runs (its loop counts on) and branches live again.
    assert.equal(await sh(src, "cat /root/unsynced.txt"), `${point}\n`);
    assert.ok(await countsOn(src, await counter(src)), "the source runs");
    const r = await api<BranchOut>("POST", `/v1/sandboxes/${src}/branch`, { tag: "again" });
    assert.equal(r.status, "ready");
    const [g] = await fork("again", 1);
    assert.ok(g);
    assert.equal(await sh(g, "cat /root/unsynced.txt"), `${point}\n`);
    await api("DELETE", `/v1/sandboxes/${g}`);
    await api("DELETE", "/v1/snapshots/again");
  });
}
