/**
 * E2B's control plane with the unmodified npm `e2b` SDK (one daemon, the E2B-style snapshot of
 * test/helpers/e2b.ts): create (metadata, envVars that every command sees, the absolute timeout),
 * getInfo, list with a metadata query and the paginator, setTimeout, pause (false when already
 * paused) and connect (resumes, the sandbox's files kept), fork (count 2; the source keeps its id
 * and end; a paused source is refused), snapshots (create, list, a sandbox from one, delete),
 * metrics, kill (true, then false), tenant isolation (another tenant's key: not found, an empty
 * list; a bad key: 401), an absolute timeout that kills a sandbox while a command runs in it, a
 * deadline kept across a kill -9 of the daemon, `forkd e2b env`, the sandbox plane's access
 * rules (routed by E2B's headers), a deadline that pauses a sandbox traffic then resumes, and
 * updateNetwork onto forkd's egress policy.
 * Commands are checked through forkd's own REST API (the sandbox plane is another file's).
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { ALL_TRAFFIC, AuthenticationError, NotFoundError, Sandbox, SandboxError } from "e2b";
import { CLI } from "../helpers/daemon.js";
import { apiRequest } from "../helpers/http.js";
import { startE2bDaemon } from "../helpers/e2b.js";
import type { E2bDaemon } from "../helpers/e2b.js";
import { steps } from "../helpers/steps.js";

let e: E2bDaemon;
const { step, failed } = steps();
const created: string[] = [];

const rest = <T>(method: string, path: string, body?: unknown) =>
  apiRequest<T>(e.daemon.ep, method, path, body, 120_000);

/** A shell command in sandbox `id` through forkd's REST API: its stdout (exit 0 asserted). */
async function sh(id: string, cmd: string): Promise<string> {
  const r = await rest<{ stdout: string; stderr: string; exit_code: number }>(
    "POST",
    `/v1/sandboxes/${id}/exec`,
    { cmd },
  );
  assert.equal(r.exit_code, 0, r.stderr);
  return r.stdout;
}

async function create(
  opts: Parameters<typeof Sandbox.create>[1] = {},
  template = e.template,
): Promise<Sandbox> {
  const sbx = await Sandbox.create(template, { timeoutMs: 600_000, requestTimeoutMs: 300_000, ...opts });
  created.push(sbx.sandboxId);
  return sbx;
}

before(async () => {
  e = await startE2bDaemon();
  Object.assign(process.env, e.env);
});

after(async () => {
  await Promise.all(created.map((id) => Sandbox.kill(id).catch(() => undefined)));
  await e?.daemon.destroy(failed());
});

let a: Sandbox;

step("Sandbox.create: a fork of the template with its metadata, env vars and absolute end", async () => {
  const t0 = Date.now();
  a = await create({ metadata: { suite: "control", which: "a" }, envs: { E2B_CONTROL_VAR: "from-create" } });
  assert.match(a.sandboxId, /^sb-[a-z2-7]{16}$/);
  const info = await a.getInfo();
  assert.equal(info.sandboxId, a.sandboxId);
  assert.equal(info.templateId, e.template);
  assert.equal(info.state, "running");
  assert.deepEqual(info.metadata, { suite: "control", which: "a" });
  assert.ok(info.cpuCount >= 1 && info.memoryMB > 0, JSON.stringify(info));
  const end = info.endAt.getTime();
  assert.ok(
    end >= t0 + 600_000 - 5_000 && end <= Date.now() + 600_000 + 5_000,
    `endAt ${info.endAt.toISOString()}`,
  );
  // The sandbox-wide env is under every command's own (here: forkd's REST exec, no env of its own).
  assert.equal((await sh(a.sandboxId, "echo $E2B_CONTROL_VAR")).trim(), "from-create");
  const own = await rest<{ stdout: string }>("POST", `/v1/sandboxes/${a.sandboxId}/exec`, {
    cmd: "echo $E2B_CONTROL_VAR",
    env: { E2B_CONTROL_VAR: "own" },
  });
  assert.equal(own.stdout.trim(), "own", "a request's own env wins");
  assert.equal(
    (await sh(a.sandboxId, "id -un; pwd")).trim(),
    "user\n/home/user",
    "the template's user and home",
  );
});

step("Sandbox.list: metadata query, state, and the paginator's pages", async () => {
  const b = await create({ metadata: { suite: "control", which: "b" } });
  const onlyB = await Sandbox.list({ query: { metadata: { which: "b" } } }).nextItems();
  assert.deepEqual(
    onlyB.map((x) => x.sandboxId),
    [b.sandboxId],
  );
  const p = Sandbox.list({ query: { metadata: { suite: "control" }, state: ["running"] }, limit: 1 });
  const seen: string[] = [];
  while (p.hasNext) {
    const page = await p.nextItems();
    assert.ok(page.length <= 1);
    seen.push(...page.map((x) => x.sandboxId));
  }
  assert.deepEqual(seen.sort(), [a.sandboxId, b.sandboxId].sort());
  const paused = await Sandbox.list({ query: { state: ["paused"] } }).nextItems();
  assert.deepEqual(paused, []);
  assert.equal(await b.kill(), true);
});

step("setTimeout moves the absolute end from now", async () => {
  await a.setTimeout(300_000);
  const end = (await a.getInfo()).endAt.getTime();
  assert.ok(Math.abs(end - (Date.now() + 300_000)) < 10_000, `endAt ${new Date(end).toISOString()}`);
});

step("pause (then false: already paused) and connect, which resumes it with its files", async () => {
  await sh(a.sandboxId, "echo kept > /home/user/before-pause.txt");
  assert.equal(await a.pause(), true);
  assert.equal((await a.getInfo()).state, "paused");
  assert.equal(await Sandbox.pause(a.sandboxId), false);
  const again = await Sandbox.connect(a.sandboxId, { timeoutMs: 600_000 });
  assert.equal(again.sandboxId, a.sandboxId);
  assert.equal((await a.getInfo()).state, "running");
  assert.equal((await sh(a.sandboxId, "cat /home/user/before-pause.txt")).trim(), "kept");
  // Connect to a running one: its end only ever moves later.
  const end = (await a.getInfo()).endAt.getTime();
  await Sandbox.connect(a.sandboxId, { timeoutMs: 10_000 });
  assert.equal((await a.getInfo()).endAt.getTime(), end);
});

step(
  "fork: count 2 from one branch; the source keeps its id and end; a paused source is refused",
  async () => {
    await sh(a.sandboxId, "echo from-source > /home/user/fork.txt");
    const before = await a.getInfo();
    const forks = await a.fork({ count: 2, timeoutMs: 600_000 });
    assert.equal(forks.length, 2);
    const ids = forks.map((f) => {
      assert.ok(f instanceof Sandbox, f instanceof Error ? f.message : "not a sandbox");
      created.push(f.sandboxId);
      return f.sandboxId;
    });
    assert.equal(new Set([...ids, a.sandboxId]).size, 3);
    for (const id of ids) {
      assert.equal(
        (await sh(id, "cat /home/user/fork.txt; echo $E2B_CONTROL_VAR")).trim(),
        "from-source\nfrom-create",
      );
    }
    const afterInfo = await a.getInfo();
    assert.equal(afterInfo.state, "running");
    assert.equal(afterInfo.endAt.getTime(), before.endAt.getTime());
    // A fork is a sandbox of its own: writes do not cross.
    await sh(ids[0]!, "echo changed > /home/user/fork.txt");
    assert.equal((await sh(ids[1]!, "cat /home/user/fork.txt")).trim(), "from-source");
    assert.equal((await sh(a.sandboxId, "cat /home/user/fork.txt")).trim(), "from-source");
    const f1 = Sandbox.connect(ids[1]!);
    await (await f1).pause();
    await assert.rejects(Sandbox.fork(ids[1]!, { count: 1 }), (err: unknown) => {
      assert.ok(err instanceof SandboxError, String(err));
      assert.match(String(err), /409/);
      return true;
    });
    for (const id of ids) assert.equal(await Sandbox.kill(id), true);
  },
);

step("snapshots: create from a running sandbox, list, create a sandbox from it, delete", async () => {
  await sh(a.sandboxId, "echo in-snapshot > /home/user/snap.txt");
  const snap = await a.createSnapshot();
  assert.ok(snap.snapshotId.length > 0);
  assert.equal((await a.getInfo()).state, "running", "the sandbox keeps running");
  const listed = await Sandbox.listSnapshots().nextItems();
  assert.ok(
    listed.some((x) => x.snapshotId === snap.snapshotId),
    JSON.stringify(listed),
  );
  const bySandbox = await Sandbox.listSnapshots({ sandboxId: a.sandboxId }).nextItems();
  assert.deepEqual(
    bySandbox.map((x) => x.snapshotId),
    [snap.snapshotId],
  );
  const c = await create({}, snap.snapshotId);
  assert.equal((await c.getInfo()).templateId, snap.snapshotId);
  assert.equal((await sh(c.sandboxId, "cat /home/user/snap.txt")).trim(), "in-snapshot");
  assert.equal(await c.kill(), true);
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true);
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false);
});

step(
  "an admin's forks and snapshots are the admins' alone: no tenant sees or creates from them",
  async () => {
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [CLI, "token", "create", "--tenant", "ops", "--admin", "--e2b"],
      { env: e.daemon.env, timeout: 60_000 },
    );
    const admin = stdout.trim();
    const src = await create({ apiKey: admin });
    const snap = await src.createSnapshot();
    const forks = await src.fork({ count: 1, timeoutMs: 600_000 });
    const fork = forks[0];
    assert.ok(fork instanceof Sandbox, fork instanceof Error ? fork.message : "not a sandbox");
    created.push(fork.sandboxId);
    const branches = (
      await rest<{ snapshots: { tag: string; owner?: string | null; branch?: { sandbox: string } }[] }>(
        "GET",
        "/v1/snapshots",
      )
    ).snapshots.filter((m) => m.branch?.sandbox === src.sandboxId);
    assert.ok(branches.some((m) => m.tag === snap.snapshotId));
    assert.ok(
      branches.some((m) => m.tag.startsWith("e2b-fork-")),
      JSON.stringify(branches),
    );
    for (const m of branches) {
      assert.notEqual(m.owner ?? null, null, `${m.tag} is not shared`);
      await assert.rejects(Sandbox.create(m.tag, { requestTimeoutMs: 300_000 }), (err: unknown) => {
        assert.match(String(err), /not found/i);
        return true;
      });
    }
    const tenantSees = await Sandbox.listSnapshots().nextItems();
    assert.ok(!tenantSees.some((x) => x.snapshotId === snap.snapshotId));
    const adminSees = await Sandbox.listSnapshots({ apiKey: admin }).nextItems();
    assert.ok(adminSees.some((x) => x.snapshotId === snap.snapshotId));
    assert.equal(await Sandbox.kill(fork.sandboxId, { apiKey: admin }), true);
    assert.equal(await Sandbox.kill(src.sandboxId, { apiKey: admin }), true);
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, { apiKey: admin }), true);
  },
);

step("metrics: one sample of the guest's CPU, memory and disk", async () => {
  const m = await a.getMetrics();
  assert.equal(m.length, 1);
  const s = m[0]!;
  assert.ok(s.memTotal > 0 && s.memUsed > 0 && s.memUsed <= s.memTotal, JSON.stringify(s));
  assert.ok(s.diskTotal > 0 && s.cpuCount >= 1, JSON.stringify(s));
  assert.ok(s.cpuUsedPct >= 0 && s.cpuUsedPct <= 100, JSON.stringify(s));
});

step("tenant isolation: another tenant's key sees nothing of it; a bad key is a 401", async () => {
  const other = await e.keyFor("other");
  assert.match(other, /^e2b_[0-9a-f]+$/);
  await assert.rejects(Sandbox.getInfo(a.sandboxId, { apiKey: other }), NotFoundError);
  assert.equal(await Sandbox.kill(a.sandboxId, { apiKey: other }), false);
  await assert.rejects(Sandbox.setTimeout(a.sandboxId, 1_000, { apiKey: other }), NotFoundError);
  await assert.rejects(Sandbox.connect(a.sandboxId, { apiKey: other }), NotFoundError);
  assert.deepEqual(await Sandbox.list({ apiKey: other }).nextItems(), []);
  assert.equal((await a.getInfo()).state, "running", "untouched");
  await assert.rejects(Sandbox.list({ apiKey: "e2b_0123456789abcdef" }).nextItems(), AuthenticationError);
});

step("kill: true, then false for a sandbox that is gone; getInfo is then not found", async () => {
  assert.equal(await a.kill(), true);
  assert.equal(await Sandbox.kill(a.sandboxId), false);
  await assert.rejects(a.getInfo(), NotFoundError);
});

step("an absolute timeout kills a sandbox while a command runs in it", async () => {
  const d = await create({ timeoutMs: 8_000 });
  // Busy for longer than its timeout: forkd's idle timeout would never end it.
  const running = rest<{ exit_code: number }>("POST", `/v1/sandboxes/${d.sandboxId}/exec`, {
    cmd: "sleep 120",
  }).then(
    () => "finished",
    (err: unknown) => `failed: ${String(err)}`,
  );
  const outcome = await running;
  assert.match(outcome, /^failed/, "the command was cut when the sandbox was killed");
  await assert.rejects(d.getInfo(), NotFoundError);
});

step(
  "the deadline (and the most metadata and env E2B takes) kept across a kill -9, honoured after it",
  async () => {
    // Over the bound a sandbox's record keeps (recovery would refuse the record): a 400 naming it.
    const over = Object.fromEntries(
      Array.from({ length: 64 }, (_, i) => [`k${i}`.padEnd(256, "k"), "v".repeat(4096)]),
    );
    await assert.rejects(create({ metadata: over }), (err: unknown) => {
      assert.match(String(err), /metadata/);
      return true;
    });
    const metadata = Object.fromEntries(Array.from({ length: 8 }, (_, i) => [`k${i}`, "m".repeat(4000)]));
    const envs = Object.fromEntries(Array.from({ length: 15 }, (_, i) => [`V${i}`, "e".repeat(4300)]));
    // Time enough for the restart and the checks below (a few seconds under TCG), not more: the
    // step then waits for the deadline to pass.
    const d = await create({ timeoutMs: 25_000, metadata, envs });
    const end = (await d.getInfo()).endAt.getTime();
    await e.daemon.kill9();
    await e.daemon.start();
    const info = await d.getInfo();
    assert.equal(info.state, "running", "re-adopted");
    assert.deepEqual(info.metadata, metadata);
    assert.equal((await sh(d.sandboxId, "echo ${#V14}")).trim(), "4300");
    assert.equal(info.endAt.getTime(), end, "the same absolute end");
    const stop = Date.now() + 120_000;
    for (;;) {
      const gone = await d.getInfo().then(
        () => false,
        (err: unknown) => err instanceof NotFoundError,
      );
      if (gone) break;
      assert.ok(Date.now() < stop, "killed at its deadline");
      await new Promise((r) => setTimeout(r, 1_000));
    }
    assert.ok(Date.now() >= end - 1_000, "not before its end");
  },
);

step("forkd e2b env prints the exports E2B's SDKs read", async () => {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [CLI, "e2b", "env", "--key", e.env.E2B_API_KEY],
    {
      env: e.daemon.env,
      timeout: 60_000,
    },
  );
  const lines = stdout.trim().split("\n");
  assert.deepEqual(lines, [
    `export E2B_API_URL=${e.env.E2B_API_URL}`,
    `export E2B_SANDBOX_URL=${e.env.E2B_SANDBOX_URL}`,
    `export E2B_API_KEY=${e.env.E2B_API_KEY}`,
  ]);
});

/** A request on the sandbox plane, routed as E2B_SANDBOX_URL mode routes (E2B's headers). */
async function plane(
  id: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: string }> {
  const res = await fetch(`${e.env.E2B_SANDBOX_URL}/health`, {
    headers: { "E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", ...headers },
  });
  return { status: res.status, body: await res.text() };
}

const tokenOf = (sbx: Sandbox): string => (sbx as unknown as { envdAccessToken: string }).envdAccessToken;

step(
  "the sandbox plane: its access token opens it; a wrong one or none, others' and gone ones all 502",
  async () => {
    const p = await create();
    const q = await create();
    assert.match(tokenOf(p), /^tok-[a-z2-7]{12}\.[0-9a-f]{64}$/, "bound to the key it was given to");
    assert.notEqual(tokenOf(p), tokenOf(q));
    const ok = await plane(p.sandboxId, { "X-Access-Token": tokenOf(p) });
    assert.ok(ok.status !== 401 && ok.status !== 502, `${ok.status} ${ok.body}`);
    // A credential that does not open it answers as a missing sandbox: ids are not probed.
    const wrong = await plane(p.sandboxId, { "X-Access-Token": tokenOf(q) });
    const missing = await plane("sb-aaaaaaaaaaaaaaaa", { "X-Access-Token": tokenOf(q) });
    assert.equal(wrong.status, 502);
    assert.equal(
      wrong.body.replaceAll(p.sandboxId, "ID"),
      missing.body.replaceAll("sb-aaaaaaaaaaaaaaaa", "ID"),
    );
    assert.equal((await plane(p.sandboxId)).status, 502);
    assert.equal(
      (await plane(p.sandboxId, { "X-API-Key": e.env.E2B_API_KEY })).status,
      502,
      "secure: a key is not enough",
    );
    const other = await e.keyFor("other2");
    assert.equal(
      (await plane(p.sandboxId, { "X-API-Key": other })).status,
      502,
      "another tenant's: as if gone",
    );
    assert.equal((await plane("sb-aaaaaaaaaaaaaaaa", { "X-Access-Token": tokenOf(p) })).status, 502);
    await p.kill();
    assert.equal((await plane(p.sandboxId, { "X-Access-Token": tokenOf(p) })).status, 502, "killed");
    await q.kill();
  },
);

step(
  "a deadline with onTimeout pause pauses the sandbox; traffic to it resumes it (autoResume)",
  async () => {
    const p = await create({ timeoutMs: 8_000, lifecycle: { onTimeout: "pause", autoResume: true } });
    await sh(p.sandboxId, "echo still-here > /home/user/auto.txt");
    const stop = Date.now() + 120_000;
    while ((await p.getInfo()).state !== "paused") {
      assert.ok(Date.now() < stop, "paused at its deadline");
      await new Promise((r) => setTimeout(r, 1_000));
    }
    const info = await p.getInfo();
    assert.deepEqual(info.lifecycle, { onTimeout: "pause", autoResume: true });
    const r = await plane(p.sandboxId, { "X-Access-Token": tokenOf(p) });
    assert.ok(r.status !== 401 && r.status !== 502, `${r.status} ${r.body}`);
    const resumed = await p.getInfo();
    assert.equal(resumed.state, "running");
    assert.ok(resumed.endAt.getTime() > Date.now(), "a new deadline");
    assert.equal((await sh(p.sandboxId, "cat /home/user/auto.txt")).trim(), "still-here");
    await p.kill();
  },
);

step("updateNetwork replaces a running sandbox's egress (forkd's policy); getInfo echoes it", async () => {
  const n = await create();
  const view = () =>
    rest<{ network: { mode: string; egress: { mode: string; allow: Array<{ cidr: string }> } | null } }>(
      "GET",
      `/v1/sandboxes/${n.sandboxId}`,
    );
  const first = await view();
  if (first.network.mode === "none") {
    // A host without netns or user-mode networking gives none, and none can be added later.
    await assert.rejects(n.updateNetwork({ allowInternetAccess: false }), /409/);
    return;
  }
  assert.equal(first.network.egress?.mode, "allow", "internet access by default");
  await n.updateNetwork({ allowInternetAccess: false });
  assert.equal((await view()).network.egress?.mode, "deny");
  await n.updateNetwork({ allowOut: ["1.1.1.1"], denyOut: [ALL_TRAFFIC] });
  const listed = (await view()).network.egress;
  assert.equal(listed?.mode, "list");
  assert.deepEqual(
    listed?.allow.map((r) => r.cidr),
    ["1.1.1.1/32"],
  );
  const info = await n.getInfo();
  assert.deepEqual(info.network?.allowOut, ["1.1.1.1"]);
  await assert.rejects(
    n.updateNetwork({ allowOut: ["example.com"], denyOut: [ALL_TRAFFIC] }),
    /domain names/,
  );
  await n.kill();
});
