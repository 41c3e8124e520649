/**
 * Jailed VMMs and resource limits with real VMs: every child's QEMU runs as its own
 * unprivileged uid with no capabilities, QEMU's seccomp filter and a mount namespace that shows
 * only its own files; one child's QEMU cannot open another's disk, sockets or memory. A child
 * over its memory limit is killed alone and the API says why; a fork bomb hits its pids limit
 * and the sandbox stays usable; a CPU quota holds; a child over its disk limit is killed alone;
 * a lifetime ends a sandbox whatever it is doing. A VMM's environment holds nothing of the
 * daemon's (its admin token); two daemons on one host never give their VMMs one uid. A
 * snapshot's parent VMM is jailed the same way.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFile, rename, stat } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { ApiError } from "../helpers/http.js";
import { checkedRequest } from "../helpers/contract.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { steps } from "../helpers/steps.js";
import { asVmm, gidOf, procStatus as status, qemuNaming, uidOf } from "../helpers/vmm-process.js";
import type { SandboxView } from "../../src/api/views/sandbox.js";

const run = promisify(execFile);
let d: TestDaemon;
const { step, failed } = steps();

type View = Pick<SandboxView, "id" | "pid" | "state" | "exit_reason" | "limits">;
interface ExecOut {
  exit_code: number | null;
  stdout: string;
  stderr: string;
}

const api = <T>(method: string, path: string, body?: unknown, timeoutMs?: number) =>
  checkedRequest<T>(d.ep, method, path, body, timeoutMs);
const fork = async (body: Record<string, unknown> = {}) =>
  (await api<{ sandboxes: View[] }>("POST", "/v1/sandboxes", { snapshot_tag: "iso", ...body })).sandboxes[0]!;
const sh = (id: string, cmd: string, timeoutMs = 120_000) =>
  api<ExecOut>("POST", `/v1/sandboxes/${id}/exec`, { cmd, timeout_ms: timeoutMs }, timeoutMs + 30_000);
let a: View;
let b: View;
/** The daemon's secrets: none may reach a child process. */
const SECRETS = {
  FORKD_TOKEN: process.env.FORKD_TOKEN ?? `it-${randomBytes(24).toString("base64url")}`,
  FORKD_REGISTRY_PASSWORD: `reg-${randomBytes(12).toString("hex")}`,
};

before(async () => {
  d = await makeDaemon({ FORKD_POOL_SIZE: "0", ...SECRETS });
  await api("POST", "/v1/snapshots", { tag: "iso", memory_mib: 256 }, 900_000);
});

after(async () => {
  await d.destroy(failed());
});

step("each child's VMM: its own uid, no capabilities, seccomp, its own cgroup", async () => {
  a = await fork();
  b = await fork();
  const [sa, sb] = [await status(a.pid), await status(b.pid)];
  for (const s of [sa, sb]) {
    assert.notEqual(s.Uid?.split(/\s+/)[0], "0", "not root");
    assert.equal(s.CapEff, "0000000000000000");
    assert.equal(s.NoNewPrivs, "1");
    assert.equal(s.Seccomp, "2", "QEMU's seccomp filter is on");
  }
  assert.notEqual(sa.Uid, sb.Uid, "a uid per VMM");
  const cg = await readFile(`/proc/${a.pid}/cgroup`, "utf8");
  assert.match(cg, new RegExp(`memory:/forkd/${a.id}$`, "m"));
  // The guest's workload runs in its own cgroup, mounted with favordynmods (cheap moves).
  assert.match((await sh(a.id, "grep cgroup2 /proc/mounts")).stdout, /favordynmods/);
  assert.equal(a.limits.memory_mib, 256 + 384, "default: guest RAM + 384 MiB");
  assert.equal(a.limits.pids, 1024);
  // Both still work.
  for (const v of [a, b]) assert.equal((await sh(v.id, "echo hi")).stdout, "hi\n");
});

step("a snapshot's parent VMM (it runs the caller's warm-up) is jailed like a child", async () => {
  const made = api(
    "POST",
    "/v1/snapshots",
    { tag: "iso-parent", memory_mib: 256, warm: "sleep 15" },
    900_000,
  );
  // A failed assertion below must not leave this to reject unheard.
  made.catch(() => undefined);
  let pid: number | null = null;
  for (let i = 0; i < 600 && pid === null; i++) {
    pid = await qemuNaming(join(d.dataDir, "run", "p-"));
    if (pid === null) await new Promise((r) => setTimeout(r, 200));
  }
  assert.ok(pid, "the parent's QEMU was seen");
  // Seen by its command line as soon as the jailer execs it; QEMU installs its own seccomp filter
  // (`-sandbox on`) during its start: what is checked is the VMM once started, so give it that.
  let st = await status(pid);
  for (let i = 0; i < 100 && st.Seccomp !== "2"; i++) {
    await new Promise((r) => setTimeout(r, 100));
    st = await status(pid);
  }
  assert.notEqual(uidOf(st), "0", "not root");
  assert.equal(st.CapEff, "0000000000000000");
  assert.equal(st.NoNewPrivs, "1");
  assert.equal(st.Seccomp, "2");
  assert.match(await readFile(`/proc/${pid}/cgroup`, "utf8"), /memory:\/forkd\/p-/m);
  // In its mount namespace the data directory shows nothing but its own directory's path.
  const ls = await asVmm(uidOf(st), gidOf(st), ["ls", "-A", join(d.dataDir, "snapshots")], pid);
  assert.ok(!ls.ok || ls.out.trim() === "", `the snapshots are hidden: ${ls.out}`);
  const own = await asVmm(uidOf(st), gidOf(st), ["ls", join(d.dataDir, "run")], pid);
  assert.ok(own.ok, own.out);
  assert.match(own.out.trim(), /^p-[0-9a-f]+$/, "only its own directory is there");
  const sock = await asVmm(uidOf(st), gidOf(st), ["stat", join(d.dataDir, "forkd.sock")], pid);
  assert.equal(sock.ok, false, "the API socket is not there");
  await made;
  // Its files were handed back to the daemon (before any child shares them with the jail's gid).
  for (const f of ["memory", "vmstate", "disk.qcow2"]) {
    const st = await stat(join(d.dataDir, "snapshots", "iso-parent", f));
    assert.equal(st.uid, 0, `${f} is the daemon's`);
    assert.equal(st.mode & 0o777, 0o444, `${f} is read-only`);
  }
  // Children of it work.
  const c = (await api<{ sandboxes: View[] }>("POST", "/v1/sandboxes", { snapshot_tag: "iso-parent" }))
    .sandboxes[0]!;
  assert.equal((await sh(c.id, "echo parent-ok")).stdout, "parent-ok\n");
  await api("DELETE", `/v1/sandboxes/${c.id}`);
  await api("DELETE", "/v1/snapshots/iso-parent");
});

step("one child's VMM cannot open another's disk, sockets or memory", async () => {
  const [sa, sb] = [await status(a.pid), await status(b.pid)];
  const [uid, gid] = [sa.Uid!.split(/\s+/)[0]!, sa.Gid!.split(/\s+/)[0]!];
  const bDir = join(d.dataDir, "sandboxes", b.id);
  // In A's own mount namespace, B's directory and the daemon's socket do not exist.
  const inNs = await asVmm(uid, gid, ["ls", join(d.dataDir, "sandboxes")], a.pid);
  assert.ok(inNs.ok, inNs.out);
  assert.deepEqual(inNs.out.trim().split("\n"), [a.id], "only its own directory is there");
  const sock = await asVmm(uid, gid, ["stat", join(d.dataDir, "forkd.sock")], a.pid);
  assert.equal(sock.ok, false);
  // Even on the host's view of the files, A's uid may not read B's disk, agent socket or memory.
  for (const target of [join(bDir, "disk.qcow2"), join(bDir, "agent.sock"), `/proc/${b.pid}/mem`]) {
    const r = await asVmm(uid, gid, ["head", "-c", "1", target]);
    assert.equal(r.ok, false, `${target} must be unreadable by another VMM`);
    assert.match(r.out, /Permission denied|No such device|not permitted/);
  }
  // Its own snapshot is readable (read-only) in its namespace; its own files writable.
  const own = await asVmm(uid, gid, ["touch", join(d.dataDir, "sandboxes", a.id, "probe")], a.pid);
  assert.ok(own.ok, own.out);
  const snapW = await asVmm(uid, gid, ["touch", join(d.dataDir, "snapshots", "iso", "probe")], a.pid);
  assert.equal(snapW.ok, false, "the snapshot is read-only to it");
  assert.equal(sb.State?.startsWith("S") || sb.State?.startsWith("R"), true);
});

step("a VMM's environment is its own: no admin token, nothing of the daemon's", async () => {
  for (const v of [a, b]) {
    const environ = await readFile(`/proc/${v.pid}/environ`, "utf8");
    const names = environ
      .split("\0")
      .filter(Boolean)
      .map((kv) => kv.slice(0, kv.indexOf("=")));
    assert.ok(names.includes("PATH"), names.join(" "));
    assert.deepEqual(
      names.filter((n) => n.startsWith("FORKD_")),
      [],
      `the VMM sees the daemon's settings: ${names.join(" ")}`,
    );
    for (const secret of Object.values(SECRETS)) assert.ok(!environ.includes(secret), "a secret in the VMM");
  }
});

step("a cwd that is not there is named as the cause, not the shell", async () => {
  const r = await api("POST", `/v1/sandboxes/${a.id}/exec`, { cmd: "pwd", cwd: "/nope" }).catch(
    (e: unknown) => e,
  );
  assert.ok(r instanceof ApiError, String(r));
  assert.equal(r.status, 400);
  assert.equal(r.message, "cwd /nope does not exist in the sandbox (ENOENT)");
  assert.equal(
    (await api<ExecOut>("POST", `/v1/sandboxes/${a.id}/exec`, { cmd: "pwd", cwd: "/tmp" })).stdout,
    "/tmp\n",
  );
});

step("two daemons on one host: their VMMs never share a uid (but the image readers' gid)", async () => {
  const d2 = await makeDaemon({ FORKD_POOL_SIZE: "0" });
  try {
    // d2 gets a copy of d's snapshot (a cold boot of its own takes minutes under TCG); its
    // children's layer names the published path of the frozen disk: d2's, after the copy.
    const staging = join(d2.dataDir, "snapshots", ".copy-iso");
    await run("cp", ["-a", "--sparse=always", join(d.dataDir, "snapshots", "iso"), staging]);
    const disk = join(d2.dataDir, "snapshots", "iso", "disk.qcow2");
    await run("qemu-img", ["rebase", "-u", "-b", disk, "-F", "qcow2", join(staging, "child.qcow2")]);
    await rename(staging, join(d2.dataDir, "snapshots", "iso"));
    const other = (
      await checkedRequest<{ sandboxes: View[] }>(d2.ep, "POST", "/v1/sandboxes", { snapshot_tag: "iso" })
    ).sandboxes[0]!;
    const theirs = await status(other.pid);
    assert.notEqual(uidOf(theirs), "0", "jailed");
    for (const v of [a, b]) {
      const mine = await status(v.pid);
      assert.notEqual(uidOf(theirs), uidOf(mine), "another daemon's VMM has one of our uids");
      // They share the guest image cache: its files' group is every daemon's.
      assert.equal(gidOf(theirs), gidOf(mine));
    }
    // So one daemon's VMM cannot signal the other's.
    const sa = await status(a.pid);
    const kill = await asVmm(uidOf(sa), gidOf(sa), ["kill", "-0", String(other.pid)]);
    assert.equal(kill.ok, false, "a VMM could signal another daemon's");
    assert.match(kill.out, /not permitted/);
    assert.equal((await sh(a.id, "echo mine")).stdout, "mine\n");
    // Restarted (kill -9), d2 keeps its range (recorded): a new child's uid is in the block of
    // its adopted one, and still none of d's.
    const block = (st: Record<string, string>) => Math.floor(Number(uidOf(st)) / 4096);
    await d2.kill9();
    await d2.start();
    const again = (
      await checkedRequest<{ sandboxes: View[] }>(d2.ep, "POST", "/v1/sandboxes", { snapshot_tag: "iso" })
    ).sandboxes[0]!;
    const [adopted, fresh] = [await status(other.pid), await status(again.pid)];
    assert.equal(block(fresh), block(adopted), "the restarted daemon took another range");
    assert.notEqual(uidOf(fresh), uidOf(adopted));
    assert.notEqual(block(fresh), block(sa), "d2's range is d's");
    const out = await checkedRequest<ExecOut>(d2.ep, "POST", `/v1/sandboxes/${other.id}/exec`, {
      cmd: "echo adopted",
    });
    assert.equal(out.stdout, "adopted\n");
  } finally {
    await d2.destroy(failed());
  }
});

step("a child over its memory limit is killed alone, and the API says why", async () => {
  const small = await fork({ limits: { memory_mib: 160 } });
  assert.equal(small.limits.memory_mib, 160);
  // Written, not just allocated: the guest must really touch the pages (170 MiB of a 256 MiB guest).
  await assert.rejects(
    sh(small.id, "python3 -c 'b = b\"x\" * (170 << 20); print(len(b))'"),
    (e: unknown) => e instanceof ApiError && /exited: killed by the host: memory limit/.test(e.message),
    "the call in flight says why the sandbox died",
  );
  let v = await api<View>("GET", `/v1/sandboxes/${small.id}`);
  for (let i = 0; i < 50 && v.state !== "exited"; i++) {
    await new Promise((r) => setTimeout(r, 200));
    v = await api<View>("GET", `/v1/sandboxes/${small.id}`);
  }
  assert.equal(v.state, "exited");
  assert.match(v.exit_reason ?? "", /memory limit of 160 MiB/);
  // Its siblings are untouched.
  for (const s of [a, b]) assert.equal((await sh(s.id, "echo still")).stdout, "still\n");
});

step("a fork bomb hits the sandbox's pids limit; the sandbox stays usable", async () => {
  const c = await fork({ limits: { pids: 48 } });
  assert.equal(c.limits.pids, 48);
  const bomb = [
    "import os, time",
    "n = 0",
    "try:",
    "    while n < 1000:",
    "        if os.fork() == 0:",
    "            time.sleep(120)",
    "            os._exit(0)",
    "        n += 1",
    "except OSError as e:",
    "    print(n, e.errno)",
  ].join("\n");
  await sh(c.id, `cat > /root/bomb.py <<'EOF'\n${bomb}\nEOF`);
  const r = await sh(c.id, "python3 /root/bomb.py");
  const [n, errno] = r.stdout.trim().split(" ").map(Number);
  assert.equal(errno, 11, `fork fails with EAGAIN: ${r.stdout} ${r.stderr}`);
  assert.ok(n !== undefined && n < 48, `stopped below the limit (${n})`);
  // (The pattern must not match this shell's own command line.)
  assert.equal((await sh(c.id, "pkill -f 'bom[b].py'; echo alive")).stdout, "alive\n");
});

step("a CPU quota bounds the VMM's CPU time", async () => {
  const q = await fork({ limits: { cpus: 0.25 } });
  assert.equal(q.limits.cpus, 0.25);
  const ticks = async () => {
    const f = (await readFile(`/proc/${q.pid}/stat`, "utf8")).split(") ")[1]!.split(" ");
    return Number(f[11]) + Number(f[12]); // utime + stime, in clock ticks (100 Hz)
  };
  const t0 = await ticks();
  const w0 = Date.now();
  await sh(q.id, "timeout 4 sh -c 'while :; do :; done'; true");
  const cpu = ((await ticks()) - t0) / 100;
  const wall = (Date.now() - w0) / 1000;
  assert.ok(cpu / wall < 0.35, `used ${(cpu / wall).toFixed(2)} cores under a 0.25 quota`);
  // And it did run busy (a VMM that never ran would pass the bound above).
  assert.ok(cpu / wall > 0.1, `used only ${(cpu / wall).toFixed(2)} cores: the busy loop did not run`);
});

step("a child over its disk limit is killed alone, and its branches' frozen layers count", async () => {
  const w = await fork({ limits: { disk_mib: 48 } });
  assert.equal(w.limits.disk_mib, 48);
  const write = (file: string, mib: number) =>
    sh(w.id, `dd if=/dev/urandom of=${file} bs=1M count=${mib} conv=fsync status=none && echo written`);
  assert.equal((await write("/root/a", 16)).stdout, "written\n", "within the limit");
  // A branch freezes the 16 MiB layer; writes go to a new one, and the limit counts both.
  const br = await api<{ tag: string }>("POST", `/v1/sandboxes/${w.id}/branch`, { tag: "iso-disk" });
  assert.equal(br.tag, "iso-disk");
  assert.equal((await sh(w.id, "echo alive")).stdout, "alive\n");
  await write("/root/b", 40).catch(() => undefined); // 40 MiB alone would fit; 16 + 40 does not
  let v = await api<View>("GET", `/v1/sandboxes/${w.id}`);
  for (let i = 0; i < 50 && v.state !== "exited"; i++) {
    await new Promise((r) => setTimeout(r, 200));
    v = await api<View>("GET", `/v1/sandboxes/${w.id}`);
  }
  assert.equal(v.state, "exited");
  assert.equal(v.exit_reason, "killed by the host: disk limit of 48 MiB exceeded");
  // Its siblings and its branch are untouched: a child of the branch has the 16 MiB file.
  for (const s of [a, b]) assert.equal((await sh(s.id, "echo still")).stdout, "still\n");
  const c = (await api<{ sandboxes: View[] }>("POST", "/v1/sandboxes", { snapshot_tag: "iso-disk" }))
    .sandboxes[0]!;
  assert.equal((await sh(c.id, "stat -c %s /root/a")).stdout, `${16 << 20}\n`);
  assert.equal(c.limits.disk_mib, null);
});

step("a lifetime ends a sandbox in use and a paused one; the API says why", async () => {
  // The paused one first: nothing slow may come between the busy one's fork and its call.
  const idle = await fork({ limits: { lifetime_ms: 15000 } });
  await api("POST", `/v1/sandboxes/${idle.id}/pause`);
  const busy = await fork({ limits: { lifetime_ms: 15000 } });
  assert.equal(busy.limits.lifetime_ms, 15000);
  const v0 = await api<View & { created: string; ends_at: string | null }>("GET", `/v1/sandboxes/${busy.id}`);
  assert.equal(Date.parse(v0.ends_at ?? "") - Date.parse(v0.created), 15000);
  // A call in flight when the lifetime ends fails with why (never an exit status, never a bare
  // lost connection, whenever its VMM's exit is seen). In flight: its command is running while
  // the sandbox still is (the command outlives any lifetime: it waits for a file never written).
  const forever = "while [ ! -e /never ]; do sleep 1; done; echo finished";
  const call = sh(busy.id, forever);
  call.catch(() => undefined);
  const streamed = api<{ type: string; error?: { code: string; message: string } }[]>(
    "POST",
    `/v1/sandboxes/${busy.id}/exec/stream`,
    { cmd: `${forever} # streamed`, timeout_ms: 120_000 },
    150_000,
  );
  streamed.catch(() => undefined);
  let running = false;
  for (let i = 0; i < 600 && !running; i++) {
    const [cmds, v] = await Promise.all([
      api<{ commands: { cmd: string }[] }>("GET", `/v1/sandboxes/${busy.id}/commands`),
      api<View>("GET", `/v1/sandboxes/${busy.id}`),
    ]);
    assert.equal(v.state, "running", "the command did not start before the lifetime ended");
    running = cmds.commands.filter((c) => c.cmd.includes("/never")).length === 2;
    if (!running) await new Promise((r) => setTimeout(r, 100));
  }
  assert.ok(running, "the command never started");
  await assert.rejects(call, (e: unknown) => {
    assert.ok(e instanceof ApiError, String(e));
    assert.equal(e.code, "unavailable", e.message);
    assert.equal(e.status, 503);
    assert.match(e.message, /^sandbox \S+ exited: killed by the host: lifetime of 15 s over$/);
    assert.equal(e.details.exit_reason, "killed by the host: lifetime of 15 s over");
    return true;
  });
  // The streamed call ends with the same error as its last event.
  const events = await streamed;
  const last = events[events.length - 1];
  assert.equal(last?.type, "error", JSON.stringify(events));
  assert.equal(last.error?.code, "unavailable");
  assert.match(last.error?.message ?? "", /^sandbox \S+ exited: killed by the host: lifetime of 15 s over$/);
  for (const id of [busy.id, idle.id]) {
    let v = await api<View>("GET", `/v1/sandboxes/${id}`);
    for (let i = 0; i < 50 && v.state !== "exited"; i++) {
      await new Promise((r) => setTimeout(r, 200));
      v = await api<View>("GET", `/v1/sandboxes/${id}`);
    }
    assert.equal(v.state, "exited", id);
    assert.equal(v.exit_reason, "killed by the host: lifetime of 15 s over");
  }
  // Its sandbox files are gone.
  await assert.rejects(readFile(join(d.dataDir, "sandboxes", idle.id, "sandbox.json")));
});
