/**
 * Host tools run jailed (src/vmm/jailed-tools.ts through native/jailer/forkd-jailer): a probe run
 * through the same runner as qemu-img and e2fsck is not root, holds no capability, sees the files
 * it is given and nothing else of the host (no data directory, no sibling file, no other
 * process, no network), writes no more than its bound, ends with its deadline taking what it
 * started with it, and what it was handed is the daemon's again after. Needs root (the jail).
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { chmod, mkdtemp, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { handTo, shareRead, takeBack } from "../../src/vmm/jail-files.js";
import { runTool } from "../../src/vmm/jailed-tools.js";
import { pidsReferencing } from "../../src/util/proc.js";
import { testTools } from "../helpers/tools.js";

const t = await testTools();
after(() => t.release());
const root = process.getuid?.() === 0;
const skip = root && t.tools.jailed ? false : "needs root and native/jailer (the jail)";

const field = (status: string, name: string): string =>
  new RegExp(`^${name}:\\s+(\\S+)`, "m").exec(status)?.[1] ?? "";

test(
  "a jailed tool is not root, holds no capability and sees only the files it is given",
  { skip },
  async () => {
    const dir = await mkdtemp(join(tmpdir(), "forkd-jt-"));
    try {
      const given = join(dir, "given");
      const hidden = join(dir, "hidden"); // world-readable, beside the given one
      const out = join(dir, "out");
      await writeFile(given, "given\n", { mode: 0o600 });
      await writeFile(hidden, "hidden\n", { mode: 0o644 });
      const probe = [
        "id -u; id -g",
        "cat /proc/self/status",
        "echo --root; ls -A /",
        "echo --proc; ls /proc",
        "echo --net; cat /proc/self/net/dev",
        `echo --given; cat ${given}`,
        `echo --hidden; cat ${hidden} 2>&1; ls ${dir} 2>&1; ls /etc; ls ${process.cwd()} 2>&1 | head -1`,
        `echo written > ${out}`,
      ].join("; ");
      const { stdout } = await runTool(t.tools, "sh", ["-c", probe], {
        reads: [given],
        creates: [out],
        timeoutMs: 30_000,
        maxFileBytes: 4096,
      });
      const [ids, rest] = [stdout.split("\n").slice(0, 2), stdout];
      const uid = Number(ids[0]);
      const o = t.jail?.opts;
      assert.ok(o, "the jail has a uid range");
      assert.ok(uid > o.uidBase && uid <= o.uidBase + o.uidCount, `uid ${uid} is one of the jail's`);
      assert.equal(Number(ids[1]), o.gid);
      assert.equal(field(rest, "CapEff"), "0000000000000000");
      assert.equal(field(rest, "CapPrm"), "0000000000000000");
      assert.equal(field(rest, "CapBnd"), "0000000000000000");
      assert.equal(field(rest, "NoNewPrivs"), "1");
      const section = (name: string) =>
        (rest.split(`--${name}\n`)[1] ?? "").split("\n--")[0]?.split("\n") ?? [];
      // Its root: the host's programs and libraries, /dev, /proc, /etc/ld.so.cache and the given file's path.
      const top = section("root").filter(Boolean);
      const allowed = new Set([
        "usr",
        "bin",
        "sbin",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "dev",
        "etc",
        "proc",
        dir.split("/")[1],
      ]);
      for (const e of top) assert.ok(allowed.has(e), `/${e} is not in the jail's root (${top.join(" ")})`);
      assert.ok(!top.includes("root") && !top.includes("home") && !top.includes("var"), top.join(" "));
      // Only its own processes (it is its namespace's init), and no network but a loopback.
      const pids = section("proc").filter((l) => /^\d+$/.test(l));
      assert.ok(pids.includes("1") && pids.length <= 3, `processes: ${pids.join(" ")}`);
      const ifaces = section("net")
        .slice(2)
        .filter(Boolean)
        .map((l) => l.trim().split(":")[0]);
      assert.deepEqual(ifaces, ["lo"]);
      assert.deepEqual(section("given").slice(0, 1), ["given"]);
      const hiddenOut = section("hidden").join("\n");
      assert.match(hiddenOut, /hidden: No such file or directory/);
      assert.doesNotMatch(hiddenOut, /^hidden$/m);
      assert.doesNotMatch(hiddenOut, /passwd|shadow|hostname/, "/etc holds ld.so.cache alone");
      // What it wrote is the daemon's again, checked; what it read is as it was.
      assert.equal(await readFile(out, "utf8"), "written\n");
      const st = await stat(out);
      assert.deepEqual([st.uid, st.gid, st.mode & 0o7777], [0, 0, 0o600]);
      assert.equal(await readFile(given, "utf8"), "given\n");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },
);

test(
  "a jailed tool writes no file past its bound, no output past its bound, and ends with its deadline",
  { skip },
  async () => {
    const dir = await mkdtemp(join(tmpdir(), "forkd-jt-"));
    try {
      const out = join(dir, "out");
      await assert.rejects(
        runTool(t.tools, "sh", ["-c", `head -c 100000 /dev/zero > ${out}`], {
          creates: [out],
          timeoutMs: 30_000,
          maxFileBytes: 4096,
        }),
        /File too large|File size limit exceeded|past its bound/,
      );
      assert.ok((await stat(out)).size <= 4096, "the file stayed within its bound");
      await assert.rejects(
        runTool(t.tools, "sh", ["-c", "head -c 3000000 /dev/zero"], {
          timeoutMs: 30_000,
          maxFileBytes: 0,
          maxOutputBytes: 1 << 20,
        }),
        /wrote more than 1048576 bytes of output/,
      );
      // What it started in the background ends with it (its PID namespace goes with its init).
      const marker = `${Date.now() % 100000}.25`;
      await assert.rejects(
        runTool(t.tools, "sh", ["-c", `sleep 1${marker} & sleep 2${marker}`], {
          timeoutMs: 500,
          maxFileBytes: 0,
        }),
        (e: Error & { code?: string }) => e.code === "timeout",
      );
      for (let i = 0; i < 50 && (await pidsReferencing(marker)).length > 0; i++)
        await new Promise((r) => setTimeout(r, 100));
      assert.deepEqual(await pidsReferencing(marker), [], "nothing it started outlives it");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },
);

test("a jailed tool's exit status and output come back as they are", { skip }, async () => {
  const r = await t.tools.exec("sh", ["-c", "echo out; echo err >&2; exit 3"], {
    timeoutMs: 30_000,
    maxFileBytes: 0,
  });
  assert.deepEqual(r, { code: 3, stdout: "out\n", stderr: "err\n" });
  const runs = t.tools.runs().find((c) => c.tool === "sh" && c.jailed);
  assert.ok(runs && runs.runs >= 1, "counted as a jailed run");
});

test("a file handed to a jail is taken back only as a regular file with one link", { skip }, async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-jt-"));
  try {
    const f = join(dir, "f");
    const host = join(dir, "host");
    await writeFile(f, "x");
    await writeFile(host, "host file", { mode: 0o600 });
    await handTo(f, 1234567, 1234567);
    assert.equal((await stat(f)).uid, 1234567);
    await takeBack(f, 0o444);
    const st = await stat(f);
    assert.deepEqual([st.uid, st.mode & 0o7777], [0, 0o444]);
    // Left as a link to a host file: refused, and the host file is untouched.
    const l = join(dir, "l");
    await symlink(host, l);
    await assert.rejects(takeBack(l, 0o644), /something other than a file/);
    await assert.rejects(shareRead(l, 1234567), /not a regular file/);
    const hs = await stat(host);
    assert.deepEqual([hs.uid, hs.gid, hs.mode & 0o7777], [0, 0, 0o600]);
    // Made readable by the jail's group, its owner kept.
    await chmod(f, 0o600);
    await shareRead(f, 1234567);
    const sh = await stat(f);
    assert.deepEqual([sh.uid, sh.gid, sh.mode & 0o7777], [0, 1234567, 0o640]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
