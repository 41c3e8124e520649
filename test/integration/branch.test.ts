/**
 * BRANCH with real VMs: a running child that changed memory, disk and processes is branched;
 * grandchildren forked from the branch see its state at branch time and diverge independently;
 * the source keeps running unaffected; repeated branches work; a half-written branch is never
 * forked or listed ready, also across a daemon crash. qemu-img on the layers the sources' VMMs
 * wrote (a later branch flattens them, a creation checks its parent's) runs jailed.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { ApiError, checkResponse, rawRequest } from "../helpers/http.js";
import { Lines } from "../helpers/lines.js";
import { isAlive } from "../../src/util/proc.js";
import { checkedRequest } from "../helpers/contract.js";
import { steps } from "../helpers/steps.js";
import { daemonToolRuns } from "../helpers/prometheus.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";

let d: TestDaemon;
const { step, failed } = steps();
let src = "";
let grandkids: string[] = [];
let blobHash = "";

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
  snapshot: { tag: string; parent: { tag: string } | null } | null;
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
    { code },
  );
  assert.equal(r.error, null, r.error?.traceback);
  return r.value;
};
const fork = async (tag: string, n: number) =>
  (
    await api<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", { snapshot_tag: tag, n })
  ).sandboxes.map((s) => s.id);

/** A command that prints a numbered line five times a second until it is stopped. */
const TICKER = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done";

/** A reply's NDJSON lines (no idle timeout: a pause may hold it quiet). */
async function lines(method: string, path: string, body?: unknown): Promise<Lines> {
  const res = await rawRequest(d.ep, method, path, body === undefined ? undefined : JSON.stringify(body), 0, {
    "content-type": "application/json",
  });
  await checkResponse(res);
  return new Lines(res);
}
/** The stdout of `l`'s lines from index `from` on. */
const textFrom = (l: Lines, from: number) =>
  l.lines
    .slice(from)
    .filter((x) => x.type === "stdout")
    .map((x) => Buffer.from(x.data as string, "base64").toString())
    .join("");
/** `l` gets a new tick (one it did not have at this call). */
async function ticksOn(l: Lines, what: string): Promise<void> {
  const from = l.lines.length;
  await l.until((x) => /tick \d+\n/.test(textFrom(x, from)), what, 120_000);
}
const listed = async (id: string) =>
  (
    await api<{ commands: { pid: number; cmd: unknown }[] }>("GET", `/v1/sandboxes/${id}/commands`)
  ).commands.map((c) => [c.pid, c.cmd]);
/** Several execs in a row after a resume: each starts (no stream id the guest holds is reused). */
async function execsWork(id: string): Promise<void> {
  for (let i = 0; i < 5; i++) assert.equal(await sh(id, `echo run ${i}`), `run ${i}\n`);
}
/** A reader reattached to `pid`, once it has had a tick. */
async function reattach(id: string, pid: number): Promise<Lines> {
  const l = await lines("GET", `/v1/sandboxes/${id}/commands/${pid}/stream`);
  await ticksOn(l, `a reader reattached to ${pid} in ${id}`);
  return l;
}
/** Signals `pid` and waits for `l` (a reader of it) to see it exit by that signal. */
async function stop(id: string, pid: number, l: Lines, signal: "SIGTERM" | "SIGKILL"): Promise<void> {
  await api("POST", `/v1/sandboxes/${id}/commands/${pid}/signal`, { signal });
  await l.until((x) => x.line("exit") !== undefined, "its exit", 120_000);
  assert.equal(l.line("exit")?.signal, signal === "SIGTERM" ? 15 : 9);
  assert.deepEqual(await listed(id), []);
}

before(async () => {
  d = await makeDaemon({ FORKD_POOL_SIZE: "1" });
});

after(async () => {
  await d.destroy(failed());
});

step("a source child changes its memory, disk and processes", async () => {
  await api(
    "POST",
    "/v1/snapshots",
    { tag: "base", memory_mib: 384, warm_eval: "import os, hashlib" },
    900_000,
  );
  src = (await fork("base", 1))[0] ?? "";
  assert.ok(src);
  await sh(src, "echo v1 > /root/state.txt");
  await sh(
    src,
    "setsid sh -c 'while true; do echo tick >> /root/ticks; sleep 0.2; done' >/dev/null 2>&1 < /dev/null &",
  );
  await py(src, "progress = [1, 2, 3]");
  blobHash = (await py(src, "blob = os.urandom(24 << 20)\nhashlib.sha256(blob).hexdigest()")) ?? "";
  assert.match(blobHash, /^'[0-9a-f]{64}'$/);
});

step("branch: the source pauses briefly, copies only what it wrote, and runs on", async () => {
  const r = await api<BranchOut>("POST", `/v1/sandboxes/${src}/branch`, { tag: "b1" });
  assert.equal(r.status, "ready");
  assert.equal(r.snapshot?.tag, "b1");
  assert.equal(r.snapshot?.parent?.tag, "base");
  assert.ok(r.private_bytes >= 24 << 20, `private bytes ${r.private_bytes} include the 24 MiB blob`);
  assert.ok(r.private_bytes < 384 << 20, "not the whole RAM");
  assert.ok(r.pause_ms > 0);
  // Its memory is the diff it wrote (a diff snapshot over base's image), not a full RAM image.
  const meta = await api<{
    format: number;
    memory_base?: { tag: string };
    files: { memory: { size: number }; memory_diff?: { size: number } };
  }>("GET", "/v1/snapshots/b1");
  assert.equal(meta.format, 3);
  assert.equal(meta.memory_base?.tag, "base");
  assert.equal(meta.files.memory.size, 384 << 20, "a child sees the whole RAM");
  const diffBytes = meta.files.memory_diff?.size ?? 0;
  assert.ok(diffBytes >= 24 << 20 && diffBytes < 192 << 20, `diff of ${diffBytes} bytes`);
  const info = await api<{ physical_bytes: number }>("GET", "/v1/snapshots/b1/info");
  assert.ok(info.physical_bytes < 192 << 20, `b1 takes ${info.physical_bytes} bytes: its diff, not its RAM`);
  // The source runs on and changes after the branch.
  await sh(src, "echo v2 > /root/state.txt");
  assert.equal(await py(src, "progress.append(4); progress"), "[1, 2, 3, 4]");
});

step(
  "grandchildren see the branch-time state: files, Python globals, memory, a running process",
  async () => {
    grandkids = await fork("b1", 3);
    assert.equal(grandkids.length, 3);
    for (const g of grandkids) {
      assert.equal(await sh(g, "cat /root/state.txt"), "v1\n");
      assert.equal(await py(g, "progress"), "[1, 2, 3]");
      assert.equal(await py(g, "hashlib.sha256(blob).hexdigest()"), blobHash);
      // The ticking loop was running at branch time, so it runs in every grandchild.
      const a = Number((await sh(g, "wc -l < /root/ticks")).trim());
      await new Promise((r) => setTimeout(r, 1500));
      const b = Number((await sh(g, "wc -l < /root/ticks")).trim());
      assert.ok(b > a, `the background loop runs in ${g} (${a} -> ${b})`);
      assert.equal((await sh(g, "hostname")).trim(), g, "each has its own identity");
    }
  },
);

step("grandchildren diverge independently, and the source is unaffected", async () => {
  await Promise.all(grandkids.map((g, i) => sh(g, `echo g${i} > /root/state.txt`)));
  await Promise.all(grandkids.map((g, i) => py(g, `progress.append(${i * 10})`)));
  for (const [i, g] of grandkids.entries()) {
    assert.equal(await sh(g, "cat /root/state.txt"), `g${i}\n`);
    assert.equal(await py(g, "progress"), `[1, 2, 3, ${i * 10}]`);
  }
  assert.equal(await sh(src, "cat /root/state.txt"), "v2\n");
  assert.equal(await py(src, "progress"), "[1, 2, 3, 4]");
  const rand = await Promise.all(grandkids.map((g) => sh(g, "head -c 16 /dev/urandom | od -An -tx1")));
  assert.equal(new Set(rand).size, 3, "their randomness is their own");
});

step("the same sandbox branched five times in a row; every branch forks", async () => {
  const pauses: number[] = [];
  for (let i = 2; i <= 6; i++) {
    await sh(src, `echo round${i} > /root/state.txt`);
    const r = await api<BranchOut>("POST", `/v1/sandboxes/${src}/branch`, {
      tag: `b${i}`,
      wait: i % 2 === 0,
    });
    pauses.push(r.pause_ms);
    assert.equal(r.status, i % 2 === 0 ? "ready" : "writing");
  }
  process.stderr.write(`branch pauses (ms): ${pauses.map((p) => p.toFixed(1)).join(", ")}\n`);
  const [g] = await fork("b5", 1); // b5 was written in the background: the fork waits for it
  assert.ok(g);
  assert.equal(await sh(g, "cat /root/state.txt"), "round5\n");
  const [h] = await fork("b6", 1);
  assert.ok(h);
  assert.equal(await sh(h, "cat /root/state.txt"), "round6\n");
  for (const id of [g, h]) await api("DELETE", `/v1/sandboxes/${id}`);
  // b3..b6 were flattened from the source's layers (the earlier branches froze them): jailed.
  const runs = await daemonToolRuns(d.ep);
  assert.ok((runs.jailed["qemu-img"] ?? 0) >= 4, JSON.stringify(runs));
  assert.deepEqual(runs.unjailed, {});
});

step("a branch of a grandchild stacks on its branch; the stacked-on snapshot cannot be deleted", async () => {
  const g0 = grandkids[0] ?? "";
  const r = await api<BranchOut>("POST", `/v1/sandboxes/${g0}/branch`, { tag: "b1-g0" });
  assert.equal(r.snapshot?.parent?.tag, "b1");
  for (const g of grandkids) await api("DELETE", `/v1/sandboxes/${g}`);
  const [c] = await fork("b1-g0", 1);
  assert.ok(c);
  assert.equal(await sh(c, "cat /root/state.txt"), "g0\n", "depth 2: base <- b1 <- b1-g0");
  assert.equal(await py(c, "progress"), "[1, 2, 3, 0]");
  await api("DELETE", `/v1/sandboxes/${c}`);
  await assert.rejects(api("DELETE", "/v1/snapshots/b1"), (e: unknown) => {
    assert.ok(e instanceof ApiError);
    assert.equal(e.code, "conflict");
    assert.match(e.message, /b1-g0/);
    return true;
  });
  await api("DELETE", "/v1/snapshots/b1-g0");
  await api("DELETE", "/v1/snapshots/b1");
});

step("a child of a diff branch pauses, resumes after a restart, and branches again", async () => {
  const [c] = await fork("b6", 1);
  assert.ok(c);
  await py(c, "deep = [progress, 'paused-child']");
  await api("POST", `/v1/sandboxes/${c}/pause`);
  await d.kill9();
  await d.start();
  await api("POST", `/v1/sandboxes/${c}/resume`);
  assert.equal(await sh(c, "cat /root/state.txt"), "round6\n");
  assert.equal(await py(c, "deep"), "[[1, 2, 3, 4], 'paused-child']");
  assert.equal(await py(c, "hashlib.sha256(blob).hexdigest()"), blobHash, "the base's pages and the diff's");
  // Resumed, it maps its own image: its branch has a full image (no memory base).
  const r = await api<BranchOut>("POST", `/v1/sandboxes/${c}/branch`, { tag: "b6-resumed" });
  const m = await api<{ format: number; memory_base?: unknown }>("GET", "/v1/snapshots/b6-resumed");
  assert.equal(m.memory_base, undefined);
  assert.equal(r.snapshot?.parent?.tag, "b6");
  const [g] = await fork("b6-resumed", 1);
  assert.ok(g);
  assert.equal(await py(g, "deep"), "[[1, 2, 3, 4], 'paused-child']");
  for (const id of [c, g]) await api("DELETE", `/v1/sandboxes/${id}`);
  await api("DELETE", "/v1/snapshots/b6-resumed");
});

step(
  "a chain of depth 4: info, forks at every depth, compact, force-orphaned and cascaded deletes",
  async () => {
    let tag = "base";
    for (let i = 1; i <= 4; i++) {
      const [c] = await fork(tag, 1);
      assert.ok(c);
      await sh(c, `echo ${i} >> /root/chain.txt`);
      await api("POST", `/v1/sandboxes/${c}/branch`, { tag: `ch${i}` });
      await api("DELETE", `/v1/sandboxes/${c}`);
      tag = `ch${i}`;
    }
    const info = await api<{
      depth: number;
      ancestors: string[];
      dependents: string[];
      physical_bytes: number;
    }>("GET", "/v1/snapshots/ch4/info");
    assert.equal(info.depth, 4);
    assert.deepEqual(info.ancestors, ["ch3", "ch2", "ch1", "base"]);
    assert.deepEqual((await api<{ dependents: string[] }>("GET", "/v1/snapshots/ch2/info")).dependents, [
      "ch3",
    ]);
    const chainOf = async (t: string) => {
      const [c] = await fork(t, 1);
      assert.ok(c);
      const out = await sh(c, "cat /root/chain.txt");
      await api("DELETE", `/v1/sandboxes/${c}`);
      return out;
    };
    assert.equal(await chainOf("ch4"), "1\n2\n3\n4\n");
    // Cumulative diffs: every depth's memory is one diff over base's image, never a chain.
    for (const t of ["ch1", "ch4"]) {
      const m = await api<{ memory_base?: { tag: string } }>("GET", `/v1/snapshots/${t}`);
      assert.equal(m.memory_base?.tag, "base", t);
    }

    const flat = await api<{ tag: string; parent?: unknown }>("POST", "/v1/snapshots/ch4/compact", {
      tag: "ch4-flat",
    });
    assert.equal(flat.parent, null);
    assert.equal((await api<{ depth: number }>("GET", "/v1/snapshots/ch4-flat/info")).depth, 0);
    assert.equal(await chainOf("ch4-flat"), "1\n2\n3\n4\n");

    await assert.rejects(
      api("DELETE", "/v1/snapshots/ch2"),
      (e: unknown) => e instanceof ApiError && e.code === "conflict",
    );
    const forced = await api<{ orphaned: string[] }>("DELETE", "/v1/snapshots/ch2?force=1");
    assert.deepEqual(forced.orphaned, ["ch3"]);
    // Their memory base (base) is no longer in their chain: they got full images.
    for (const t of ["ch3", "ch4"]) {
      const m = await api<{ memory_base?: unknown; files: { memory_diff?: unknown } }>(
        "GET",
        `/v1/snapshots/${t}`,
      );
      assert.deepEqual([m.memory_base, m.files.memory_diff], [undefined, undefined], t);
    }
    assert.equal(await chainOf("ch3"), "1\n2\n3\n", "an orphaned layer still forks");
    assert.equal(await chainOf("ch4"), "1\n2\n3\n4\n", "and so does what stacks on it");
    assert.deepEqual((await api<{ ancestors: string[] }>("GET", "/v1/snapshots/ch4/info")).ancestors, [
      "ch3",
    ]);

    // After a restart (nothing verified yet), ch4 still forks: the rewrite of ch3 re-pointed it.
    await d.kill9();
    await d.start();
    assert.equal(await chainOf("ch4"), "1\n2\n3\n4\n");
    const cascaded = await api<{ cascaded: string[] }>("DELETE", "/v1/snapshots/ch3?cascade=1");
    assert.deepEqual(cascaded.cascaded, ["ch4"]);
    await assert.rejects(
      api("GET", "/v1/snapshots/ch4"),
      (e: unknown) => e instanceof ApiError && e.code === "not_found",
    );
    await api("DELETE", "/v1/snapshots/ch1");
    assert.equal(await chainOf("ch4-flat"), "1\n2\n3\n4\n", "the compacted copy needs none of them");
  },
);

step("the CLI builds a chain layer: snapshot --from T --tag T2 --exec CMD", async () => {
  const r = await cli(d, [
    "snapshot",
    "--from",
    "base",
    "--tag",
    "layer1",
    "--exec",
    "echo built > /root/layer.txt",
  ]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /snapshot layer1 ready \(layer on base\)/);
  const [c] = await fork("layer1", 1);
  assert.ok(c);
  assert.equal(await sh(c, "cat /root/layer.txt"), "built\n");
  await api("DELETE", `/v1/sandboxes/${c}`);
  const bad = await cli(d, ["snapshot", "--from", "base", "--tag", "layer2", "--exec", "exit 7"]);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /exit 7\); no snapshot made/);
  await assert.rejects(
    api("GET", "/v1/snapshots/layer2"),
    (e: unknown) => e instanceof ApiError && e.code === "not_found",
  );
  const all = await api<{ sandboxes: { id: string }[] }>("GET", "/v1/sandboxes");
  assert.deepEqual(
    all.sandboxes.map((s) => s.id),
    [src],
    "the layer builder's children are gone",
  );
});

step("a daemon killed mid-branch: the tag is failed (and cleaned) or ready, never half-written", async () => {
  await sh(src, "echo crash > /root/state.txt");
  const r = await api<BranchOut>("POST", `/v1/sandboxes/${src}/branch`, { tag: "crash", wait: false });
  assert.equal(r.status, "writing");
  await d.kill9();
  await d.start();
  const st = await api<{ status: string; error?: unknown }>("GET", "/v1/snapshots/crash");
  if (st.status === "failed") {
    await assert.rejects(fork("crash", 1), (e: unknown) => e instanceof ApiError && e.code === "conflict");
    await api("DELETE", "/v1/snapshots/crash");
  } else {
    assert.equal(st.status, "ready");
    const [g] = await fork("crash", 1);
    assert.ok(g);
    assert.equal(await sh(g, "cat /root/state.txt"), "crash\n");
  }
  const left = (await readdir(join(d.dataDir, "snapshots"))).filter((n) => n.startsWith(".staging-"));
  assert.deepEqual(left, [], "no partial files remain");
  // The source survived the daemon's death and still works.
  assert.equal(await sh(src, "cat /root/state.txt"), "crash\n");
});

step(
  "pause frees the VM; resume after a daemon restart brings back files, globals and processes",
  async () => {
    await sh(src, "echo before-pause > /root/state.txt");
    await py(src, "paused_note = 'kept'");
    const view = await api<{ state: string; pid: number }>("POST", `/v1/sandboxes/${src}/pause`);
    assert.equal(view.state, "paused");
    assert.equal(isAlive(view.pid), false, "the VMM is gone: its memory is free");
    await assert.rejects(
      api("POST", `/v1/sandboxes/${src}/exec`, { cmd: "true" }),
      (e: unknown) => e instanceof ApiError && e.code === "conflict" && /paused/.test(e.message),
    );
    await assert.rejects(
      api("DELETE", "/v1/snapshots/base"),
      (e: unknown) => e instanceof ApiError && e.code === "conflict",
    );
    await d.kill9();
    await d.start();
    assert.equal((await api<{ state: string }>("GET", `/v1/sandboxes/${src}`)).state, "paused");
    const back = await api<{ id: string; state: string }>("POST", `/v1/sandboxes/${src}/resume`);
    assert.deepEqual([back.id, back.state], [src, "running"]);
    assert.equal(await sh(src, "cat /root/state.txt"), "before-pause\n");
    assert.equal(await py(src, "paused_note"), "'kept'");
    const a = Number((await sh(src, "wc -l < /root/ticks")).trim());
    await new Promise((r) => setTimeout(r, 1500));
    assert.ok(Number((await sh(src, "wc -l < /root/ticks")).trim()) > a, "its background loop runs again");
    assert.equal((await sh(src, "hostname")).trim(), src, "same identity");
    // Paused and resumed again: the second image is built on the first.
    await api("POST", `/v1/sandboxes/${src}/pause`);
    await api("POST", `/v1/sandboxes/${src}/resume`);
    assert.equal(await py(src, "paused_note"), "'kept'");
    // And a resumed sandbox still branches.
    const b = await api<BranchOut>("POST", `/v1/sandboxes/${src}/branch`, { tag: "after-resume" });
    const [g] = await fork(b.tag, 1);
    assert.ok(g);
    assert.equal(await py(g, "paused_note"), "'kept'");
    // Paused while a branch of it is still being finished: the image that branch reads from (the
    // previous pause's) stays until it is done, so the branch comes out ready and whole.
    await py(src, "racing_note = 'from-the-race'");
    const nb = await api<BranchOut>("POST", `/v1/sandboxes/${src}/branch`, { tag: "racing", wait: false });
    assert.equal(nb.status, "writing");
    await api("POST", `/v1/sandboxes/${src}/pause`);
    await api("POST", `/v1/sandboxes/${src}/resume`);
    const [r] = await fork("racing", 1);
    assert.ok(r);
    assert.equal(await py(r, "racing_note"), "'from-the-race'");
    assert.equal((await api<{ status?: string; tag?: string }>("GET", "/v1/snapshots/racing")).tag, "racing");
  },
);

step("an idle timeout can pause instead of kill", async () => {
  const r = await api<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", {
    snapshot_tag: "base",
    n: 1,
    timeout_ms: 2000,
    on_idle: "pause",
  });
  const id = r.sandboxes[0]?.id ?? "";
  await sh(id, "echo idle > /root/idle.txt");
  const deadline = Date.now() + 60_000;
  let state = "running";
  while (state !== "paused" && Date.now() < deadline) {
    await new Promise((res) => setTimeout(res, 500));
    state = (await api<{ state: string }>("GET", `/v1/sandboxes/${id}`)).state;
  }
  assert.equal(state, "paused");
  await api("POST", `/v1/sandboxes/${id}/resume`);
  assert.equal(await sh(id, "cat /root/idle.txt"), "idle\n");
  await api("DELETE", `/v1/sandboxes/${id}`);
});

step(
  "a command runs on through a pause and resume, a branch's children, a deadline's pause and a daemon restart",
  async () => {
    const [c] = await fork("base", 1);
    assert.ok(c);
    const owner = await lines("POST", `/v1/sandboxes/${c}/exec/stream`, { cmd: TICKER });
    await ticksOn(owner, "its first output");
    const pid = owner.line("started")?.pid as number;
    await api("POST", `/v1/sandboxes/${c}/pause`);
    assert.deepEqual(await listed(c), [[pid, TICKER]], "listed while paused: it runs on in the saved guest");
    await api("POST", `/v1/sandboxes/${c}/resume`);
    assert.deepEqual(await listed(c), [[pid, TICKER]]);
    await execsWork(c);
    await ticksOn(owner, "the output to the client that started it, after the resume");
    await reattach(c, pid);
    // A branch taken while it runs: each child runs it too, and tracks it.
    const b = await api<BranchOut>("POST", `/v1/sandboxes/${c}/branch`, { tag: "with-ticker" });
    const [g] = await fork(b.tag, 1);
    assert.ok(g);
    assert.deepEqual(await listed(g), [[pid, TICKER]]);
    await execsWork(g);
    await stop(g, pid, await reattach(g, pid), "SIGKILL");
    await api("DELETE", `/v1/sandboxes/${g}`);
    // A daemon restart: the new daemon finds it running in the guest.
    await d.kill9();
    await d.start();
    assert.deepEqual(await listed(c), [[pid, TICKER]]);
    await execsWork(c);
    await stop(c, pid, await reattach(c, pid), "SIGTERM");
    await execsWork(c);
    await api("DELETE", `/v1/sandboxes/${c}`);
    // Paused by its deadline (the sweeper), in use: the same.
    const r = await api<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", {
      snapshot_tag: "base",
      n: 1,
      deadline_ms: 8_000,
      on_deadline: "pause",
    });
    const p = r.sandboxes[0]?.id ?? "";
    const o2 = await lines("POST", `/v1/sandboxes/${p}/exec/stream`, { cmd: TICKER });
    await ticksOn(o2, "its first output");
    const pid2 = o2.line("started")?.pid as number;
    const until = Date.now() + 120_000;
    while ((await api<{ state: string }>("GET", `/v1/sandboxes/${p}`)).state !== "paused") {
      assert.ok(Date.now() < until, "paused at its deadline");
      await new Promise((res) => setTimeout(res, 500));
    }
    await api("POST", `/v1/sandboxes/${p}/resume`);
    assert.deepEqual(await listed(p), [[pid2, TICKER]]);
    await execsWork(p);
    await ticksOn(o2, "the output to the client that started it, after the resume");
    await stop(p, pid2, await reattach(p, pid2), "SIGTERM");
    await o2.until((x) => x.line("exit") !== undefined, "the exit on the stream that started it");
    await api("DELETE", `/v1/sandboxes/${p}`);
  },
);

step("branches outlive their source: later branches' disks do not lean on its directory", async () => {
  await api("DELETE", `/v1/sandboxes/${src}`);
  for (const [tag, want] of [
    ["b6", "round6\n"],
    ["after-resume", "before-pause\n"],
  ] as const) {
    const [g] = await fork(tag, 1);
    assert.ok(g, `fork of ${tag}`);
    assert.equal(await sh(g, "cat /root/state.txt"), want);
    await api("DELETE", `/v1/sandboxes/${g}`);
  }
});
