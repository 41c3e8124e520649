/**
 * The TypeScript SDK against a real daemon and real VMs, imported as users import it
 * (`@forkd/sdk`, built from sdk/typescript). The daemon is found through FORKD_SOCKET, as an E2B
 * program that only changed its import would find it.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { Readable } from "node:stream";
import {
  ApiClient,
  CommandExitError,
  CommandTimeoutError,
  Controller,
  InvalidArgumentError,
  NotFoundError,
  Sandbox,
  TimeoutError,
  UnavailableError,
  fork,
} from "@forkd/sdk";
import { steps } from "../helpers/steps.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";

let d: TestDaemon;
const { step, failed } = steps();
let sb: Sandbox;
const WARM = "sdk-warm";

before(async () => {
  d = await makeDaemon({ FORKD_POOL_SIZE: "1" });
  process.env.FORKD_SOCKET = d.ep.socket;
  delete process.env.FORKD_URL;
  delete process.env.FORKD_SNAPSHOT;
});

after(async () => {
  await d.destroy(failed());
});

const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

step("Sandbox.create() with no arguments creates the default snapshot once, then forks it", async () => {
  sb = await Sandbox.create({ metadata: { suite: "ts" } });
  assert.match(sb.sandboxId, /^sb-[a-z2-7]{16}$/);
  const info = await sb.getInfo();
  assert.equal(info.snapshot, "default");
  assert.equal(info.state, "running");
  assert.deepEqual(info.metadata, { suite: "ts" });
  assert.ok(
    info.timings.totalMs > 0 && info.timings.readyMs > 0,
    "the fork's timings (total_ms on the wire)",
  );
  assert.equal(await sb.isRunning(), true);
  const again = await Sandbox.connect(sb.sandboxId);
  assert.equal(again.sandboxId, sb.sandboxId);
  const listed = await Sandbox.list({ query: { metadata: { suite: "ts" } } });
  assert.deepEqual(
    listed.map((s) => s.sandboxId),
    [sb.sandboxId],
  );
});

step(
  "commands.run: output, exit codes, env, cwd, stdin; a failing command throws CommandExitError",
  async () => {
    const r = await sb.commands.run("echo out; echo err >&2; echo $GREETING; pwd", {
      envs: { GREETING: "héllo" },
      cwd: "/tmp",
    });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, "out\nhéllo\n/tmp\n");
    assert.equal(r.stderr, "err\n");
    assert.equal((await sb.commands.run("tr a-z A-Z", { stdin: "shout" })).stdout, "SHOUT");
    await assert.rejects(sb.commands.run("echo no >&2; exit 3"), (e: unknown) => {
      assert.ok(e instanceof CommandExitError);
      assert.equal(e.exitCode, 3);
      assert.equal(e.stderr, "no\n");
      return true;
    });
    const argv = await sb.commands.run(["printf", "%s|", "a b", "c"]);
    assert.equal(argv.stdout, "a b|c|");
    // E2B's shape: a command past its timeout is a TimeoutError (with the output so far)
    await assert.rejects(sb.commands.run("sleep 10", { timeoutMs: 500 }), (e: unknown) => {
      assert.ok(e instanceof CommandTimeoutError && e instanceof TimeoutError);
      assert.equal(e.result.timedOut, true);
      return true;
    });
  },
);

step(
  "commands.run user: the image's nobody, with its groups and home; root by default; an unknown user is InvalidArgumentError",
  async () => {
    const r = await sb.commands.run('id -un; id -u; id -gn; pwd; echo "$HOME|$USER"', { user: "nobody" });
    assert.equal(r.stdout, "nobody\n65534\nnogroup\n/\n/nonexistent|nobody\n");
    // nobody cannot write root's home; the default user (root, the template's) can
    await assert.rejects(
      sb.commands.run("touch /root/by-nobody", { user: "nobody" }),
      (e: unknown) => e instanceof CommandExitError && /Permission denied/.test(e.stderr),
    );
    assert.equal((await sb.commands.run("id -un; pwd; touch /root/by-root")).stdout, "root\n/root\n");
    await assert.rejects(sb.commands.run("true", { user: "no-such-user" }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.match(e.message, /^no user 'no-such-user' in the image's \/etc\/passwd/);
      return true;
    });
  },
);

step("REST eval in javascript where the image has no node: UnavailableError naming it, at once", async () => {
  const t0 = Date.now();
  const e = await new ApiClient()
    .eval(sb.sandboxId, { code: "1 + 1", language: "javascript" })
    .catch((x: unknown) => x);
  assert.ok(e instanceof UnavailableError, String(e));
  assert.equal(e.message, "no node interpreter in this image (eval needs node or nodejs on PATH)");
  assert.equal(e.status, 503);
  assert.ok(Date.now() - t0 < 10_000, "not a wait for a kernel that cannot come");
});

step("streaming callbacks fire while the command runs, not at its end", async () => {
  const seen: Array<{ at: number; data: string }> = [];
  const t0 = Date.now();
  const r = await sb.commands.run("echo first; sleep 2; echo second", {
    onStdout: (data) => seen.push({ at: Date.now() - t0, data }),
  });
  const end = Date.now() - t0;
  assert.equal(r.stdout, "first\nsecond\n");
  assert.ok(seen.length >= 2, `expected two chunks, got ${JSON.stringify(seen)}`);
  assert.equal(seen[0]?.data, "first\n");
  assert.ok(
    (seen[0]?.at ?? end) < end - 1000,
    `first chunk at ${seen[0]?.at} ms should precede the end (${end} ms) by the sleep`,
  );
});

step("background commands: list, stdin, kill, wait", async () => {
  const cat = await sb.commands.run("cat", { background: true, stdin: true });
  assert.ok(cat.pid > 1);
  assert.ok((await sb.commands.list()).some((p) => p.pid === cat.pid && p.stdinOpen));
  await cat.sendStdin("hello ");
  await cat.sendStdin(new Uint8Array(Buffer.from("world")));
  await cat.closeStdin();
  const done = await cat.wait();
  assert.equal(done.stdout, "hello world");

  const sleeper = await sb.commands.run("sleep 600", { background: true, timeoutMs: 0 });
  assert.ok((await sb.commands.list()).some((p) => p.pid === sleeper.pid));
  assert.equal(await sleeper.kill(), true);
  await assert.rejects(sleeper.wait(), (e: unknown) => {
    assert.ok(e instanceof CommandExitError);
    assert.equal(e.result.signal, 9);
    return true;
  });
  assert.ok(!(await sb.commands.list()).some((p) => p.pid === sleeper.pid));
  assert.equal(await sb.commands.kill(sleeper.pid), false, "killing an exited command says so");
});

step("files: text, binary round trip, 10 MiB, list, exists, makeDir, rename, remove", async () => {
  const w = await sb.files.write("/root/notes/a.txt", "grüße\n");
  assert.equal(w.path, "/root/notes/a.txt");
  assert.equal(w.name, "a.txt");
  assert.equal(await sb.files.read("/root/notes/a.txt"), "grüße\n");

  const every = new Uint8Array(256).map((_, i) => i);
  await sb.files.write("/root/bytes.bin", every);
  assert.deepEqual(await sb.files.read("/root/bytes.bin", { format: "bytes" }), every);

  const big = randomBytes(10 << 20);
  const info = await sb.files.write("/root/big.bin", big);
  assert.equal(info.size, big.length);
  const back = await sb.files.read("/root/big.bin", { format: "bytes" });
  assert.equal(back.length, big.length);
  assert.equal(sha(back), sha(big));
  const inGuest = await sb.commands.run("sha256sum /root/big.bin");
  assert.equal(inGuest.stdout.split(" ")[0], sha(big));

  const entries = await sb.files.list("/root");
  const names = entries.map((e) => `${e.name}:${e.type}`);
  // modifiedTime comes from the stat's mtime_ms: a real date, not NaN.
  assert.ok(entries.every((e) => e.modifiedTime.getFullYear() > 2000));
  assert.ok(names.includes("notes:dir") && names.includes("big.bin:file"), names.join(","));
  assert.equal(await sb.files.exists("/root/notes/a.txt"), true);
  assert.equal(await sb.files.exists("/root/nope"), false);
  assert.equal(await sb.files.makeDir("/root/x/y/z"), true);
  assert.equal(await sb.files.makeDir("/root/x/y/z"), false);
  const moved = await sb.files.rename("/root/notes/a.txt", "/root/x/a.txt");
  assert.equal(moved.path, "/root/x/a.txt");
  assert.equal(moved.type, "file");
  await sb.files.remove("/root/x");
  assert.equal(await sb.files.exists("/root/x"), false);
  await assert.rejects(sb.files.read("/root/x/a.txt"), NotFoundError);
});

step("runCode: values, persistent globals, captured output, errors with tracebacks", async () => {
  const a = await sb.runCode("import math\nr = 3\nprint('radius', r)\nround(math.pi * r * r, 2)");
  assert.equal(a.text, "28.27");
  assert.deepEqual(a.logs.stdout, ["radius 3\n"]);
  assert.equal(a.error, undefined);
  const b = await sb.runCode("r * 2");
  assert.equal(b.text, "6");
  // A matrix product goes through the guest's BLAS: it must suit the emulated CPU.
  const m = await sb.runCode("a = np.arange(9.0).reshape(3, 3)\nfloat((a @ a).sum())");
  assert.equal(m.error, undefined, m.error?.traceback);
  assert.equal(m.text, "486.0");
  const c = await sb.runCode("def f():\n    return 1 / 0\nf()");
  assert.equal(c.error?.name, "ZeroDivisionError");
  assert.match(c.error?.traceback ?? "", /return 1 \/ 0/);
  assert.equal(c.text, undefined);
  // an untyped caller can pass any name: refused before any request
  await assert.rejects(sb.runCode("1", { language: "cobol" as never }), InvalidArgumentError);
});

step("runCode: a matplotlib figure comes back as PNG; display() sends rich output", async () => {
  const r = await sb.runCode(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nNone",
    { timeoutMs: 120_000 },
  );
  assert.equal(r.error, undefined, r.error?.traceback);
  const png = r.results.find((x) => x.png);
  assert.ok(png, `no PNG in ${JSON.stringify(r.results.map((x) => x.formats()))}`);
  assert.equal(
    Buffer.from(png.png ?? "", "base64")
      .subarray(1, 4)
      .toString(),
    "PNG",
  );
  const h = await sb.runCode(
    "class Card:\n    def _repr_html_(self):\n        return '<b>hi</b>'\ndisplay(Card())\nCard()",
  );
  assert.equal(h.results.length, 2);
  assert.equal(h.results[0]?.html, "<b>hi</b>");
  assert.equal(h.results[0]?.isMainResult, false);
  assert.equal(h.results[1]?.html, "<b>hi</b>");
  assert.equal(h.results[1]?.isMainResult, true);
});

step("a snapshot warmed with Python globals: fork(tag, 3) children inherit them and diverge", async () => {
  const progress: string[] = [];
  const ctl = new Controller();
  const meta = await ctl.createSnapshot({
    tag: WARM,
    memoryMiB: 384,
    warmEval: "import numpy as np\nseed_value = 41\nweights = np.arange(5)",
    onProgress: (m) => progress.push(m),
  });
  assert.equal(meta.tag, WARM);
  assert.equal(meta.machine.memory_mib, 384);
  assert.equal(meta.warm_eval, "import numpy as np\nseed_value = 41\nweights = np.arange(5)");
  assert.ok(meta.timings.boot_ms > 0);
  assert.ok(progress.length > 0, "progress lines arrive while the snapshot is made");
  assert.ok((await ctl.listSnapshots()).some((s) => s.tag === WARM));

  const kids = await fork(WARM, 3);
  assert.equal(kids.length, 3);
  const first = await Promise.all(kids.map((k) => k.runCode("seed_value + int(weights.sum())")));
  assert.deepEqual(
    first.map((e) => e.text),
    ["51", "51", "51"],
  );
  await Promise.all(kids.map((k, i) => k.runCode(`seed_value = ${i * 100}`)));
  const after = await Promise.all(kids.map((k) => k.runCode("seed_value")));
  assert.deepEqual(
    after.map((e) => e.text),
    ["0", "100", "200"],
  );
  // Their randomness is their own.
  const rand = await Promise.all(kids.map((k) => k.runCode("np.random.bytes(16).hex()")));
  assert.equal(new Set(rand.map((e) => e.text)).size, 3);
  await Promise.all(kids.map((k) => k.kill()));
});

step("branch(): a running sandbox's state (files, globals) forks into new children", async () => {
  const s = await Sandbox.create({ snapshot: WARM });
  await s.files.write("/root/step.txt", "after step 1");
  await s.runCode("plan = ['explore', 'exploit']");
  const b = await s.branch({ tag: "ts-branch" });
  assert.equal(b.tag, "ts-branch");
  assert.equal(b.status, "ready");
  assert.ok(b.pauseMs > 0 && b.privateBytes > 0);
  await s.runCode("plan.append('after the branch')");
  const kids = await fork("ts-branch", 2);
  for (const k of kids) {
    assert.equal(await k.files.read("/root/step.txt"), "after step 1");
    assert.equal((await k.runCode("len(plan)")).text, "2", "a forked child sees its parent's globals");
  }
  assert.equal((await s.runCode("len(plan)")).text, "3");
  const bg = await s.branch({ wait: false });
  assert.equal(bg.status, "writing");
  const late = await fork(bg.tag, 1); // waits for the snapshot
  assert.equal((await late[0]?.runCode("len(plan)"))?.text, "3");
  await Promise.all([...kids, ...late, s].map((k) => k.kill()));
});

step("setIdleTimeout (forkd's): an idle sandbox is killed and says why; use keeps it alive", async () => {
  const s = await Sandbox.create({ snapshot: WARM, idleTimeoutMs: 60_000 });

  assert.equal((await s.getInfo()).idleTimeoutMs, 60_000);
  await s.setIdleTimeout(3_000);
  const info = await s.getInfo();
  assert.equal(info.idleTimeoutMs, 3_000);
  assert.ok(info.endAt && info.endAt.getTime() > Date.now());
  // Used every second for 5 s: never idle for 3 s, so it lives.
  for (let i = 0; i < 5; i++) {
    await s.commands.run("true");
    await new Promise((r) => setTimeout(r, 1_000));
  }
  assert.equal(await s.isRunning(), true);
  // A running command counts as use, however long it takes.
  await s.commands.run("sleep 5");
  assert.equal(await s.isRunning(), true);
  await new Promise((r) => setTimeout(r, 6_000));
  const gone = await s.getInfo();
  assert.equal(gone.state, "exited");
  assert.equal(gone.exitReason, "idle timeout");
  await assert.rejects(Sandbox.connect(s.sandboxId), /idle timeout/);
  assert.equal(await s.kill(), true, "an exited sandbox can still be deleted");
});

step("setTimeout (E2B's, absolute): a busy sandbox is killed at its deadline", async () => {
  const s = await Sandbox.create({
    snapshot: WARM,
    timeoutMs: 600_000,
    idleTimeoutMs: 600_000,
    lifecycle: { onTimeout: "kill" },
  });
  const info = await s.getInfo();
  assert.ok(info.deadline && info.deadline.getTime() > Date.now() + 60_000, String(info.deadline));
  assert.equal(info.idleTimeoutMs, 600_000);
  assert.equal(info.lifecycle.onTimeout, "kill");
  const busy = await s.commands.run("sleep 600", { background: true, timeoutMs: 0 });
  await s.setTimeout(3_000);
  const set = await s.getInfo();
  assert.ok(set.deadline && set.endAt && set.endAt.getTime() === set.deadline.getTime());
  // Busy all the while (a command runs): only the absolute deadline ends it.
  let state = set.state;
  for (let i = 0; i < 120 && state === "running"; i++) {
    await new Promise((r) => setTimeout(r, 500));
    state = (await s.getInfo()).state;
  }
  const gone = await s.getInfo();
  assert.equal(gone.state, "exited");
  assert.match(gone.exitReason ?? "", /deadline/);
  await assert.rejects(busy.wait());
  assert.equal(await s.kill(), true);
});

step(
  "E2B's surface: create envs seen by commands and forks, home layout, EntryInfo, iteration, connect, paginator, pause/connect, metrics, fork(count), snapshots",
  async () => {
    const e = await Sandbox.create({ envs: { SB_ENV: "from-create" }, metadata: { suite: "ts-e2b" } });
    try {
      assert.equal((await e.commands.run("echo $SB_ENV")).stdout, "from-create\n");
      assert.equal((await e.commands.run("echo $SB_ENV", { envs: { SB_ENV: "mine" } })).stdout, "mine\n");
      // relative paths and the default cwd: the user's home (root's: the template has no `user`)
      assert.equal((await e.files.write("rel.txt", "hey")).path, "/root/rel.txt");
      assert.equal((await e.commands.run("pwd; cat rel.txt")).stdout, "/root\nhey");
      const info = await e.files.getInfo("rel.txt");
      assert.deepEqual(
        [info.name, info.type, info.size, info.permissions, info.owner, info.group],
        ["rel.txt", "file", 3, "-rw-r--r--", "root", "root"],
      );
      const many = await e.files.writeFiles([
        { path: "a/1", data: "1" },
        { path: "/tmp/2", data: "22" },
      ]);
      assert.deepEqual(
        many.map((w) => w.path),
        ["/root/a/1", "/tmp/2"],
      );
      // gzip uploads (E2B's option): bytes and a stream, stored decompressed
      const text = "gzipped ".repeat(50_000);
      assert.equal((await e.files.write("gz.txt", text, { gzip: true })).size, text.length);
      assert.equal(await e.files.read("gz.txt"), text);
      const parts = [Buffer.alloc(1 << 20, 97), Buffer.from("end")];
      assert.equal(
        (await e.files.write("/tmp/gz.bin", Readable.from(parts), { gzip: true })).size,
        (1 << 20) + 3,
      );
      assert.equal(
        Buffer.from(await e.files.read("/tmp/gz.bin", { format: "bytes" })).equals(Buffer.concat(parts)),
        true,
      );
      // a background command: iterated, and followed by commands.connect
      const h = await e.commands.run("for i in 1 2 3; do echo $i; sleep 0.3; done", { background: true });
      const follower = await e.commands.connect(h.pid);
      let seen = "";
      for await (const c of h) seen += c.stdout ?? "";
      assert.equal(seen, "1\n2\n3\n");
      assert.equal((await follower.wait()).exitCode, 0);
      await assert.rejects(e.commands.connect(h.pid), NotFoundError);
      // a command started by this object, attached to from another one (Sandbox.connect): the
      // output from the attach on and the exit reach both; kill() from the attached side kills it
      const other = await Sandbox.connect(e.sandboxId);
      const bg = await e.commands.run("read x; echo got $x; echo err >&2; exit 3", {
        background: true,
        stdin: true,
      });
      let live = "";
      const far = await other.commands.connect(bg.pid, { onStdout: (s) => void (live += s) });
      await other.commands.sendStdin(bg.pid, "hi\n");
      await assert.rejects(
        far.wait(),
        (err: unknown) =>
          err instanceof CommandExitError &&
          err.exitCode === 3 &&
          err.stdout === "got hi\n" &&
          err.stderr === "err\n",
      );
      assert.equal(live, "got hi\n");
      await assert.rejects(
        bg.wait(),
        (err: unknown) => err instanceof CommandExitError && err.exitCode === 3,
      );
      const sleeper = await e.commands.run("sleep 600", { background: true });
      const first = await other.commands.connect(sleeper.pid);
      const second = await other.commands.connect(sleeper.pid);
      assert.equal(await second.kill(), true);
      for (const w of [sleeper, first, second]) {
        await assert.rejects(
          w.wait(),
          (err: unknown) => err instanceof CommandExitError && err.result.signal === 9,
        );
      }
      await assert.rejects(other.commands.connect(sleeper.pid), NotFoundError);
      // the paginator: one per page
      const pages: string[][] = [];
      const p = Sandbox.list({ query: { metadata: { suite: "ts-e2b" }, state: ["running"] }, limit: 1 });
      while (p.hasNext) pages.push((await p.nextItems()).map((s) => s.sandboxId));
      assert.deepEqual(pages.flat(), [e.sandboxId]);
      const m = await e.getMetrics();
      assert.equal(m.length, 1);
      assert.ok(m[0] && m[0].cpuCount >= 1 && m[0].memTotal > 0 && m[0].memUsed > 0, JSON.stringify(m));
      // fork(count): every fork has the files and the env; the source keeps running
      const forks = await e.fork({ count: 2 });
      assert.equal(forks.length, 2);
      for (const f of forks) {
        assert.ok(f instanceof Sandbox, f instanceof Error ? f.message : "not a sandbox");
        assert.equal((await f.commands.run("cat rel.txt; echo $SB_ENV")).stdout, "heyfrom-create\n");
        await f.kill();
      }
      assert.equal((await e.getInfo()).state, "running");
      const snap = await e.createSnapshot();
      assert.ok((await e.listSnapshots()).some((x) => x.snapshotId === snap.snapshotId));
      // pause, listed as paused; connect() resumes it
      assert.equal(await e.pause(), true);
      assert.equal(await Sandbox.pause(e.sandboxId), false);
      const paused = await Sandbox.list({ query: { state: ["paused"] } });
      assert.ok(paused.some((s) => s.sandboxId === e.sandboxId));
      const back = await Sandbox.connect(e.sandboxId);
      assert.equal((await back.getInfo()).state, "running");
      assert.equal((await back.commands.run("cat rel.txt")).stdout, "hey");
    } finally {
      await e.kill();
    }
  },
);

step("errors are typed: unknown ids and snapshots, bad arguments", async () => {
  await assert.rejects(Sandbox.connect("sb-aaaaaaaaaaaaaaaa"), NotFoundError);
  await assert.rejects(Sandbox.connect("../../etc"), InvalidArgumentError);
  await assert.rejects(Sandbox.create({ snapshot: "no-such-snapshot" }), NotFoundError);
  await assert.rejects(Sandbox.create({ snapshot: "bad tag!" }), InvalidArgumentError);
  // E2B's layout: a relative path is under the user's home (root's in this template)
  await assert.rejects(sb.files.read("relative/path"), NotFoundError);
  assert.equal(await Sandbox.kill("sb-aaaaaaaaaaaaaaaa"), false);
  assert.equal(await sb.kill(), true);
  assert.equal(await sb.kill(), false);
});
