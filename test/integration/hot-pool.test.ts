/**
 * The hot warm pool with real VMs: members are restored, warmed and stopped ahead of forks; the
 * children they become have identities of their own (kernel RNG, Python's generators, hostname,
 * sandbox id, clock) unlike each other and unlike a cold child, and nothing the warm-up ran is
 * visible (files, history, the interpreter's count, globals and contexts, the command list, the
 * exec metrics). The pool is bounded for the host (FORKD_POOL_MAX), drains snapshots nobody
 * forks, drains on snapshot delete, and a kill -9 leaves no pool VMM behind. One daemon, one
 * snapshot and its branches.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { pidsReferencing } from "../../src/util/proc.js";
import { checkedRequest } from "../helpers/contract.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { count, parseMetrics } from "../helpers/prometheus.js";
import { rawRequest, readAll } from "../helpers/http.js";
import { steps } from "../helpers/steps.js";

const TAG = "hotpool";
const MAX = 3;
const IDLE_S = 45;
let d: TestDaemon;
const { step, failed } = steps();

interface ExecOut {
  exit_code: number | null;
  stdout: string;
  stderr: string;
}
interface EvalOut {
  ok: boolean;
  value: string | null;
  execution_count: number | null;
  error: { traceback: string } | null;
}
interface PoolState {
  total: number;
  hot: number;
  max: number;
  tags: Record<string, { ready: number; hot: number; target: number; score: number }>;
}

const api = <T>(method: string, path: string, body?: unknown) => checkedRequest<T>(d.ep, method, path, body);
const sh = async (id: string, cmd: string): Promise<string> => {
  const r = await api<ExecOut>("POST", `/v1/sandboxes/${id}/exec`, { cmd });
  assert.equal(r.exit_code, 0, `${cmd}: ${r.stderr}`);
  return r.stdout;
};
const py = async (id: string, code: string): Promise<EvalOut> => {
  const r = await api<EvalOut>("POST", `/v1/sandboxes/${id}/eval`, { code });
  assert.equal(r.error, null, r.error?.traceback);
  return r;
};
const poolState = async (): Promise<PoolState> =>
  (await api<{ pool_state: PoolState }>("GET", "/v1/health")).pool_state;
const record = async (id: string): Promise<{ fromPool: boolean; hotPool?: boolean }> =>
  JSON.parse(await readFile(join(d.dataDir, "sandboxes", id, "sandbox.json"), "utf8")) as {
    fromPool: boolean;
    hotPool?: boolean;
  };
const execCount = async (): Promise<number> => {
  const res = await rawRequest(d.ep, "GET", "/metrics", undefined, 60_000);
  const text = (await readAll(res)).toString("utf8");
  assert.equal(res.statusCode, 200, text);
  return count(await parseMetrics(text), "forkd_exec_seconds");
};

async function until<T>(what: string, fn: () => Promise<T | undefined | false>, ms = 300_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** Pool VMMs: processes under the sandboxes dir that no listed sandbox is. */
async function poolPids(): Promise<number[]> {
  const { sandboxes } = await api<{ sandboxes: { pid: number }[] }>("GET", "/v1/sandboxes");
  const kids = new Set(sandboxes.map((s) => s.pid));
  return (await pidsReferencing(join(d.dataDir, "sandboxes") + "/")).filter((p) => !kids.has(p));
}

before(async () => {
  d = await makeDaemon({
    FORKD_POOL_SIZE: "2",
    FORKD_POOL_MAX: String(MAX),
    FORKD_POOL_IDLE_S: String(IDLE_S),
  });
});

after(async () => {
  await d.destroy(failed());
});

let hot: string[] = [];
let cold = "";
let execsBefore = 0;

step("a snapshot's pool becomes hot without a user exec being counted", async () => {
  const meta = await api<{ tag: string }>("POST", "/v1/snapshots", {
    tag: TAG,
    memory_mib: 384,
    // ssl.RAND_bytes: the parent's kernel instantiates OpenSSL's generator before the freeze.
    warm_eval: "warm_var = 41 + 1\nimport ssl\nwarm_token = ssl.RAND_bytes(16).hex()",
  });
  assert.equal(meta.tag, TAG);
  execsBefore = await execCount();
  const s = await until("two hot members", async () => {
    const p = await poolState();
    return (p.tags[TAG]?.hot ?? 0) >= 2 ? p : undefined;
  });
  assert.equal(s.hot, 2);
  assert.equal(s.max, MAX);
  assert.equal(await execCount(), execsBefore, "the warm-up's execs are not counted as the users'");
  // they sit stopped in the pool for a while: the children's clocks must still be right
  await new Promise((r) => setTimeout(r, 8_000));
});

step("a fork of three takes the two hot members and starts one cold", async () => {
  const r = await api<{ sandboxes: { id: string; from_pool: boolean }[]; failures: unknown[] }>(
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: TAG, n: 3 },
  );
  assert.deepEqual(r.failures, []);
  const recs = await Promise.all(r.sandboxes.map(async (s) => ({ id: s.id, rec: await record(s.id) })));
  hot = recs.filter((x) => x.rec.hotPool === true).map((x) => x.id);
  const rest = recs.filter((x) => x.rec.hotPool !== true);
  assert.equal(hot.length, 2, "two children were hot pool members");
  assert.equal(rest.length, 1);
  assert.equal(rest[0]!.rec.fromPool, false);
  cold = rest[0]!.id;
  for (const id of hot) assert.equal((await record(id)).fromPool, true);
});

step("every child has its own kernel RNG, Python generators, hostname, id and a right clock", async () => {
  const all = [...hot, cold];
  const seen = new Map<string, Set<string>>();
  const distinct = (what: string, v: string) => {
    const s = seen.get(what) ?? new Set<string>();
    assert.ok(!s.has(v), `two children share ${what}: ${v}`);
    s.add(v);
    seen.set(what, s);
  };
  for (const id of all) {
    distinct("/dev/urandom", await sh(id, "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"));
    distinct("boot_id", await sh(id, "cat /proc/sys/kernel/random/boot_id"));
    const r = await py(id, "import os, random\n(os.urandom(16).hex(), random.getrandbits(64))");
    distinct("python os.urandom/random", r.value ?? "");
    // OpenSSL's generator in the kernel process (its state was the parent's: forkd-rand.so)
    const o = await py(id, "import ssl\n(ssl.RAND_bytes(16).hex(), warm_token)");
    distinct("python ssl.RAND_bytes", (o.value ?? "").slice(0, 36));
    const host = (await sh(id, "hostname")).trim();
    assert.equal(host, id, "hostname is the sandbox id");
    distinct("hostname", host);
    assert.equal((await sh(id, "cat /run/forkd/sandbox-id")).trim(), id);
    const before = Date.now();
    const guest = Number((await sh(id, "date +%s%N")).trim()) / 1e6;
    const afterMs = Date.now();
    assert.ok(guest >= before - 2_000 && guest <= afterMs + 2_000, `guest clock ${guest} vs host ${before}`);
  }
});

step("nothing the warm-up ran is visible: files, history, count, globals, contexts, commands", async () => {
  const probe = async (id: string) => ({
    files: await sh(
      id,
      "find /tmp /root /home /var/tmp /run -xdev 2>/dev/null | grep -v '^/run/forkd/sandbox-id$' | sort; " +
        "cat /root/.ash_history /root/.bash_history /root/.python_history 2>/dev/null; true",
    ),
    cell: await py(
      id,
      "import linecache\n(sorted(k for k in globals() if not k.startswith('__')), " +
        "sorted(k for k in linecache.cache if k.startswith('<cell')))",
    ),
    contexts: (await api<{ contexts: { id: string }[] }>("GET", `/v1/sandboxes/${id}/contexts`)).contexts.map(
      (c) => c.id,
    ),
  });
  // The command list before any user command (a fresh hot child) is empty.
  const r = await api<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", { snapshot_tag: TAG, n: 1 });
  const fresh = r.sandboxes[0]!.id;
  const cmds = await api<{ commands: unknown[] }>("GET", `/v1/sandboxes/${fresh}/commands`);
  assert.deepEqual(cmds.commands, []);
  await api("DELETE", `/v1/sandboxes/${fresh}`);
  const c = await probe(cold);
  for (const id of hot) {
    const h = await probe(id);
    assert.equal(h.files, c.files, "the same files as a cold child");
    assert.equal(h.cell.execution_count, c.cell.execution_count, "the same execution count");
    assert.equal(h.cell.value, c.cell.value, "the same globals and cell sources");
    assert.deepEqual(h.contexts, c.contexts);
  }
  assert.match(c.cell.value ?? "", /warm_var/, "the snapshot's own globals are there");
  const warm = await py(hot[0]!, "warm_var");
  assert.equal(warm.value, "42");
});

step("the pool stays within FORKD_POOL_MAX across many snapshots, and drains the idle ones", async () => {
  const branches: string[] = [];
  for (let i = 0; i < 3; i++) {
    const b = await api<{ tag: string }>("POST", `/v1/sandboxes/${hot[0]!}/branch`, {
      tag: `${TAG}-b${i}`,
      wait: true,
    });
    branches.push(b.tag);
  }
  const maxSeen = { total: 0, pids: 0 };
  for (const tag of branches) {
    const r = await api<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", {
      snapshot_tag: tag,
      n: 1,
    });
    await sh(r.sandboxes[0]!.id, "true");
    for (let i = 0; i < 6; i++) {
      const s = await poolState();
      maxSeen.total = Math.max(maxSeen.total, s.total);
      // one member may be on its way in besides the ready ones
      maxSeen.pids = Math.max(maxSeen.pids, (await poolPids()).length);
      await new Promise((res) => setTimeout(res, 1_000));
    }
    await api("DELETE", `/v1/sandboxes/${r.sandboxes[0]!.id}`);
  }
  assert.ok(maxSeen.total <= MAX, `at most ${MAX} members (saw ${maxSeen.total})`);
  assert.ok(maxSeen.pids <= MAX + 1, `at most ${MAX} members and one being made (saw ${maxSeen.pids})`);
  // deleting a snapshot drains its members
  const last = branches[branches.length - 1]!;
  await until(
    "the last branch to have a member",
    async () => ((await poolState()).tags[last]?.ready ?? 0) > 0,
  );
  await api("DELETE", `/v1/snapshots/${last}`);
  const after = await poolState();
  assert.equal(after.tags[last], undefined, "a deleted snapshot has no members");
  // nobody forks any more: every snapshot loses its members after the idle time
  await until(
    "the idle pool to drain",
    async () => (await poolState()).total === 0 && (await poolPids()).length === 0,
    (IDLE_S + 60) * 1000,
  );
});

step("after kill -9 and a restart no pool VMM is left", async () => {
  // a fork makes the base snapshot wanted again: its members are made
  const r = await api<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", { snapshot_tag: TAG, n: 1 });
  const child = r.sandboxes[0]!.id;
  await until("a member to be ready", async () => ((await poolState()).tags[TAG]?.ready ?? 0) > 0);
  assert.ok((await poolPids()).length > 0);
  await d.kill9();
  await d.start();
  const left = await poolPids();
  assert.deepEqual(left, [], "no pool VMM survived the daemon");
  assert.equal((await sh(child, "echo alive")).trim(), "alive", "the child was adopted");
});
