/**
 * The fork engine end to end, with real VMs (TCG here): snapshot a warmed Python parent, fork
 * ten children, and prove inheritance, isolation, identity, streaming, files, failure
 * containment, daemon restart and bad input — all through the daemon's API and CLI.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readdir, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { checkResponse, rawRequest, readAll, ApiError } from "../helpers/http.js";
import { sha256File } from "../../src/snapshot/meta.js";
import { pidsReferencing } from "../../src/util/proc.js";
import { checkedRequest } from "../helpers/contract.js";
import { steps } from "../helpers/steps.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";

const TAG = "itest";
const N = 10;
let d: TestDaemon;
let ids: string[] = [];
const { step, failed } = steps();

interface ExecOut {
  exit_code: number | null;
  signal: number | null;
  timed_out: boolean;
  stdout: string;
  stderr: string;
}
interface EvalOut {
  ok: boolean;
  value: string | null;
  stdout: string;
  error: { name: string; traceback: string } | null;
}
interface Meta {
  files: { memory: { sha256: string }; disk: { sha256: string } };
}

// Every reply is checked against the committed OpenAPI document.
const api = <T>(method: string, path: string, body?: unknown) => checkedRequest<T>(d.ep, method, path, body);
const sh = (id: string, cmd: string, extra: Record<string, unknown> = {}) =>
  api<ExecOut>("POST", `/v1/sandboxes/${id}/exec`, { cmd, ...extra });
const py = (id: string, code: string) => api<EvalOut>("POST", `/v1/sandboxes/${id}/eval`, { code });
const id = (i: number): string => {
  const v = ids[i];
  if (v === undefined) throw new Error(`no child ${i}: the fork step failed`);
  return v;
};

before(async () => {
  d = await makeDaemon();
});

after(async () => {
  await d.destroy(failed());
});

step("snapshot a warmed python parent through the CLI", async () => {
  const r = await cli(d, [
    "snapshot",
    "--tag",
    TAG,
    "--memory",
    "512",
    "--warm",
    "echo warm-file > /root/warm.txt",
    "--warm-eval",
    "warm_var = 41 + 1\nimport numpy as np\nwarm_arr = np.arange(5)",
  ]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /snapshot itest ready/);
  const list = await cli(d, ["images", "--json"]);
  assert.deepEqual(
    (JSON.parse(list.stdout) as { snapshots: { tag: string }[] }).snapshots.map((s) => s.tag),
    [TAG],
  );
});

step(`fork ${N} children; each answers its agent and has its own record`, async () => {
  const r = await api<{
    sandboxes: { id: string; pid: number; tag: string; created: string }[];
    failures: unknown[];
  }>("POST", "/v1/sandboxes", { snapshot_tag: TAG, n: N });
  assert.deepEqual(r.failures, []);
  assert.equal(r.sandboxes.length, N);
  ids = r.sandboxes.map((s) => s.id);
  assert.equal(new Set(ids).size, N);
  assert.equal(new Set(r.sandboxes.map((s) => s.pid)).size, N);
  for (const s of r.sandboxes) {
    assert.match(s.id, /^sb-[a-z2-7]{16}$/);
    assert.equal(s.tag, TAG);
    assert.ok(!Number.isNaN(Date.parse(s.created)));
  }
});

step("every child sees the parent's warm state: file, Python globals, numpy imported", async () => {
  assert.equal(ids.length, N);
  await Promise.all(
    ids.map(async (sb) => {
      assert.equal((await sh(sb, "cat /root/warm.txt")).stdout, "warm-file\n");
      assert.equal((await py(sb, "import sys\n'numpy' in sys.modules")).value, "True");
      assert.equal((await py(sb, "warm_var")).value, "42");
      assert.equal((await py(sb, "int(warm_arr.sum())")).value, "10");
    }),
  );
});

step("a child's writes to memory and disk are invisible to siblings and to the image", async () => {
  const meta = await api<Meta>("GET", `/v1/snapshots/${TAG}`);
  assert.equal((await py(id(0), "warm_var = 'changed'\nwarm_var")).value, "'changed'");
  assert.equal(
    (await sh(id(0), "echo mine > /root/own.txt && echo extra >> /root/warm.txt && sync")).exit_code,
    0,
  );
  assert.equal((await sh(id(0), "cat /root/own.txt")).stdout, "mine\n");
  for (const sb of ids.slice(1)) {
    assert.equal((await py(sb, "warm_var")).value, "42");
    const r = await sh(sb, "cat /root/own.txt; cat /root/warm.txt");
    assert.equal(r.stdout, "warm-file\n");
    assert.match(r.stderr, /No such file/);
  }
  const snapDir = join(d.dataDir, "snapshots", TAG);
  assert.equal((await sha256File(join(snapDir, "memory"))).sha256, meta.files.memory.sha256);
  assert.equal((await sha256File(join(snapDir, "disk.qcow2"))).sha256, meta.files.disk.sha256);
});

step("every child has its own identity: RNG, hostname, sandbox id, clock", async () => {
  assert.equal(ids.length, N);
  const seen = new Set<string>();
  for (const sb of ids) {
    const r = await sh(
      sb,
      "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; hostname; cat /run/forkd/sandbox-id; echo; date +%s",
    );
    const [rand, host, sid, clock] = r.stdout.trim().split("\n");
    assert.equal(host, sb);
    assert.equal(sid, sb);
    assert.ok(Math.abs(Number(clock) - Date.now() / 1000) < 30, `guest clock ${clock} is off`);
    assert.ok(!seen.has(rand!), "two children produced the same random bytes");
    seen.add(rand!);
    const p = await py(
      sb,
      "import random, os\n(random.getrandbits(64), int(np.random.randint(0, 2**62)), os.urandom(8).hex())",
    );
    assert.ok(!seen.has(p.value!), "two children's interpreters produced the same random values");
    seen.add(p.value!);
  }
});

step("streaming exec delivers output before the command ends", async () => {
  const t0 = Date.now();
  const res = await checkResponse(
    await rawRequest(
      d.ep,
      "POST",
      `/v1/sandboxes/${id(1)}/exec/stream`,
      JSON.stringify({ cmd: "echo first; sleep 2; echo second" }),
      60_000,
      {
        "content-type": "application/json",
      },
    ),
  );
  const events: { type: string; at: number; data?: string; exit_code?: number }[] = [];
  let buf = "";
  for await (const chunk of res) {
    buf += (chunk as Buffer).toString();
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      events.push({ ...(JSON.parse(buf.slice(0, nl)) as { type: string }), at: Date.now() - t0 });
      buf = buf.slice(nl + 1);
    }
  }
  const out = events.filter((e) => e.type === "stdout");
  const exit = events.find((e) => e.type === "exit");
  assert.equal(Buffer.from(out[0]!.data!, "base64").toString(), "first\n");
  assert.equal(exit?.exit_code, 0);
  assert.ok(exit.at - out[0]!.at >= 1500, `first output at ${out[0]!.at} ms, exit at ${exit.at} ms`);
});

step("files round-trip binary data and support list, stat, mkdir, rename, remove", async () => {
  const data = Buffer.concat([Buffer.from(Array.from({ length: 256 }, (_, i) => i)), randomBytes(3 << 20)]);
  const base = `/v1/sandboxes/${id(2)}/files`;
  await checkResponse(
    await rawRequest(
      d.ep,
      "PUT",
      `${base}?path=${encodeURIComponent("/root/dir/sub/blob.bin")}&parents=1`,
      data,
    ),
  );
  const got = await readAll(
    await checkResponse(await rawRequest(d.ep, "GET", `${base}?path=/root/dir/sub/blob.bin`)),
  );
  assert.ok(got.equals(data), "downloaded bytes differ from uploaded bytes");
  assert.equal(
    (await api<{ size: number }>("GET", `${base}/stat?path=/root/dir/sub/blob.bin`)).size,
    data.length,
  );
  await api("POST", `${base}/mkdir`, { path: "/root/dir/other", parents: true });
  await api("POST", `${base}/rename`, { from: "/root/dir/sub/blob.bin", to: "/root/dir/other/moved.bin" });
  const list = await api<{ entries: { name: string; type: string }[] }>("GET", `${base}/list?path=/root/dir`);
  assert.deepEqual(
    list.entries.map((e) => `${e.name}:${e.type}`),
    ["other:dir", "sub:dir"],
  );
  assert.equal(
    (await sh(id(2), "sha256sum /root/dir/other/moved.bin | cut -c1-64")).stdout.trim(),
    (await import("node:crypto")).createHash("sha256").update(data).digest("hex"),
  );
  await api("DELETE", `${base}?path=/root/dir&recursive=1`);
  await assert.rejects(
    api("GET", `${base}/stat?path=/root/dir`),
    (e: unknown) => e instanceof ApiError && e.status === 404,
  );
  // Sibling untouched.
  assert.match((await sh(id(3), "ls /root/dir")).stderr, /No such file/);
});

step("a command that exceeds its timeout is killed and reported", async () => {
  const r = await sh(id(3), "sleep 30", { timeout_ms: 500 });
  assert.equal(r.timed_out, true);
  assert.equal(r.signal, 9);
});

step("the CLI's exec exits with the guest command's code and streams its output", async () => {
  const r = await cli(d, ["exec", id(4), "--", "sh", "-c", "echo out; echo err >&2; exit 7"]);
  assert.equal(r.code, 7);
  assert.equal(r.stdout, "out\n");
  assert.equal(r.stderr, "err\n");
  const piped = await cli(
    d,
    ["exec", "-i", id(4), "--", "python3", "-"],
    60_000,
    "import sys\nprint(sum(range(10)), file=sys.stderr)\n",
  );
  assert.equal(piped.code, 0);
  assert.equal(piped.stderr, "45\n");
  const doctor = await cli(d, ["doctor", "--json"]);
  assert.equal(doctor.code, 0, doctor.stdout);
  const checks = JSON.parse(doctor.stdout) as { name: string; status: string; detail: string }[];
  assert.ok(checks.some((c) => c.name === "accelerator" && /tcg|kvm/.test(c.detail)));
  assert.ok(checks.every((c) => c.status !== "fail"));
  const ls = await cli(d, ["ls", "--json"]);
  assert.equal((JSON.parse(ls.stdout) as unknown[]).length, N);
});

step("SIGKILL of one child's VMM leaves its siblings working", async () => {
  const victim = await api<{ pid: number }>("GET", `/v1/sandboxes/${id(5)}`);
  process.kill(victim.pid, "SIGKILL");
  const deadline = Date.now() + 15_000;
  let state = "running";
  while (Date.now() < deadline && state === "running") {
    state = (await api<{ state: string }>("GET", `/v1/sandboxes/${id(5)}`)).state;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(state, "exited");
  await assert.rejects(sh(id(5), "true"), (e: unknown) => e instanceof ApiError && e.status === 409);
  for (const sb of ids.filter((_, i) => i !== 5))
    assert.equal((await sh(sb, "echo alive")).stdout, "alive\n");
  await api("DELETE", `/v1/sandboxes/${id(5)}`);
  ids = ids.filter((_, i) => i !== 5);
});

step("a pre-started VMM from the pool serves the next fork; the CLI copies files both ways", async () => {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const h = await api<{ pool: Record<string, number> }>("GET", "/v1/health");
    if ((h.pool[TAG] ?? 0) >= 1) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  const r = await api<{ sandboxes: { id: string; from_pool: boolean }[] }>("POST", "/v1/sandboxes", {
    snapshot_tag: TAG,
    n: 1,
  });
  const sb = r.sandboxes[0]!;
  assert.equal(sb.from_pool, true);
  assert.equal((await py(sb.id, "warm_var")).value, "42");
  ids.push(sb.id);
  const local = join(d.dataDir, "cp-src.bin");
  const back = join(d.dataDir, "cp-back.bin");
  const bytes = randomBytes(200_000);
  await writeFile(local, bytes);
  assert.equal((await cli(d, ["cp", local, `${sb.id}:/root/in/cp.bin`])).code, 0);
  assert.equal((await cli(d, ["cp", `${sb.id}:/root/in/cp.bin`, back])).code, 0);
  assert.ok((await readFile(back)).equals(bytes));
  await rm(local);
  await rm(back);
});

step("a daemon killed with SIGKILL re-adopts its running children on restart", async () => {
  const before = (await api<{ sandboxes: { id: string; pid: number }[] }>("GET", "/v1/sandboxes")).sandboxes;
  await d.kill9();
  for (const s of before) process.kill(s.pid, 0); // still alive without their daemon
  await d.start();
  const after = (
    await api<{ sandboxes: { id: string; pid: number; state: string }[] }>("GET", "/v1/sandboxes")
  ).sandboxes;
  assert.deepEqual(
    after.map((s) => `${s.id}:${s.pid}:${s.state}`).sort(),
    before.map((s) => `${s.id}:${s.pid}:running`).sort(),
  );
  assert.equal((await py(id(0), "warm_var")).value, "'changed'");
  for (const sb of ids) assert.equal((await sh(sb, "cat /run/forkd/sandbox-id")).stdout, sb);
  // The old daemon's pre-started VMMs were not sandboxes: the new daemon killed them.
  const vmms = (await pidsReferencing(join(d.dataDir, "sandboxes") + "/")).length;
  assert.equal(vmms, ids.length);
});

step("bad input against the live daemon gets clear errors and leaves nothing behind", async () => {
  const expectErr = async (p: Promise<unknown>, status: number, code: string) =>
    assert.rejects(p, (e: unknown) => e instanceof ApiError && e.status === status && e.code === code);
  await expectErr(api("POST", "/v1/sandboxes", { snapshot_tag: "no-such-tag", n: 1 }), 404, "not_found");
  await expectErr(api("POST", "/v1/sandboxes", { snapshot_tag: TAG, n: 1001 }), 400, "invalid_argument");
  await expectErr(api("POST", "/v1/sandboxes", { snapshot_tag: "../../etc", n: 1 }), 400, "invalid_argument");
  await expectErr(api("POST", "/v1/snapshots", { tag: TAG }), 409, "conflict");
  await expectErr(api("DELETE", `/v1/snapshots/${TAG}`), 409, "conflict");
  await expectErr(api("POST", `/v1/sandboxes/${id(0)}/exec`, { cmd: ["/no/such/binary"] }), 404, "not_found");
  await expectErr(api("GET", `/v1/sandboxes/${id(0)}/files?path=/no/such/file`), 404, "not_found");
  const bad = await cli(d, ["fork", "--tag", "bad tag!"]);
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /tag/);
  // TENANT/NAME is a key an admin may name (docs/api.md, "Tags and namespaces"): absent, not invalid
  const absent = await cli(d, ["fork", "--tag", "nobody/tag"]);
  assert.equal(absent.code, 3, absent.stderr);
  assert.match(absent.stderr, /not found|no snapshot/i);
  const dirs = (await readdir(join(d.dataDir, "sandboxes"))).sort();
  assert.deepEqual(dirs, [...ids].sort());
  assert.deepEqual((await readdir(join(d.dataDir, "snapshots"))).sort(), [TAG]);
});

step("a second daemon on the same data directory refuses to start", async () => {
  const r = await cli(d, ["daemon"], 30_000);
  assert.notEqual(r.code, 0);
  assert.match(r.stderr, /another forkd daemon already owns/);
  assert.equal((await api<{ ok: boolean }>("GET", "/v1/health")).ok, true);
});

step("kill --all and rmi clean up every file", async () => {
  const r = await cli(d, ["kill", "--all"]);
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(await readdir(join(d.dataDir, "sandboxes")), []);
  assert.equal((await cli(d, ["rmi", TAG])).code, 0);
  assert.deepEqual(await readdir(join(d.dataDir, "snapshots")), []);
});
