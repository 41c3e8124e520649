/**
 * forkd's container image (deploy/Dockerfile): installed and built by the host's own scripts
 * rather than copies of them, and its entry point (deploy/container-init.sh) readies a cgroup
 * v2 container for per-sandbox cgroups, moving every process into a leaf, and touches nothing
 * anywhere else. The script runs here against a stand-in cgroup directory.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { exists } from "../../src/util/index.js";
import { REPO_DIR } from "../../src/host/paths.js";

const INIT = join(REPO_DIR, "deploy", "container-init.sh");

test("the image installs and builds as a host does (setup-host.sh and install.sh, not copies of them)", async () => {
  const dockerfile = await readFile(join(REPO_DIR, "deploy", "Dockerfile"), "utf8");
  assert.match(dockerfile, /^FROM debian:12 AS base$/m);
  assert.match(dockerfile, /FORKD_HOST_TEST_PACKAGES=0 bash \/tmp\/setup-host\.sh/);
  assert.match(dockerfile, /FORKD_HOST_TEST_PACKAGES=0 bash scripts\/install\.sh/);
  assert.match(
    dockerfile,
    /^ENTRYPOINT \["\/opt\/forkd\/deploy\/container-init\.sh", "\/usr\/bin\/tini", "--", "\/usr\/local\/bin\/forkd"\]$/m,
  );
  const setup = await readFile(join(REPO_DIR, "scripts", "setup-host.sh"), "utf8");
  assert.match(setup, /\[ "\$\{FORKD_HOST_TEST_PACKAGES:-1\}" = 0 \] \|\| PKGS\+=\("\$\{TEST_PKGS\[@\]\}"\)/);
});

interface Stage {
  fs: string;
  self: string;
}

/** A stand-in for /sys/fs/cgroup (v2 or v1) and /proc/self/cgroup. */
async function stage(dir: string, o: { v2: boolean; self: string }): Promise<Stage> {
  const fs = join(dir, "cgroup");
  await mkdir(fs);
  if (o.v2) {
    await writeFile(join(fs, "cgroup.controllers"), "cpuset cpu io memory pids\n");
    await writeFile(join(fs, "cgroup.subtree_control"), "");
    await writeFile(join(fs, "cgroup.procs"), "1\n23\n45\n");
  } else {
    await mkdir(join(fs, "memory"));
  }
  const self = join(dir, "self-cgroup");
  await writeFile(self, o.self);
  return { fs, self };
}

/** Runs the entry point with `echo ran "$@"` as its command; returns what that printed. */
function runInit(s: Stage, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(
      "/bin/sh",
      [INIT, "/bin/sh", "-c", 'echo ran "$@"', "sh", ...args],
      { env: { PATH: "/usr/bin:/bin", FORKD_CGROUP_FS: s.fs, FORKD_CGROUP_SELF: s.self }, timeout: 10_000 },
      (err, stdout, stderr) => (err ? reject(new Error(`${err.message}: ${stderr}`)) : resolve(stdout)),
    );
  });
}

test("container-init.sh: on cgroup v2 at the namespace's root, every process moves into init/, then the command runs", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-cg-"));
  try {
    const s = await stage(dir, { v2: true, self: "0::/\n" });
    assert.equal(await runInit(s, ["daemon", "--x"]), "ran daemon --x\n");
    assert.equal(
      await readFile(join(s.fs, "init", "cgroup.procs"), "utf8"),
      "1\n23\n45\n",
      "one pid a write",
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("container-init.sh touches nothing on cgroup v1 or below the namespace's root", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-cg-"));
  try {
    for (const [what, o] of [
      ["v1", { v2: false, self: "9:memory:/\n" }],
      ["not the namespace's root", { v2: true, self: "0::/kubepods/pod1/ctr\n" }],
    ] as const) {
      const sub = join(dir, what.replaceAll(" ", "-").replaceAll("'", ""));
      await mkdir(sub);
      const s = await stage(sub, o);
      assert.equal(await runInit(s, ["gateway"]), "ran gateway\n", what);
      assert.equal(await exists(join(s.fs, "init")), false, `${what}: no init/`);
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
