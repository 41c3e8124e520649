/**
 * forkd-memsnap against a real process: a Python process maps a file MAP_PRIVATE and writes some
 * pages; `capture` must take exactly those pages (not the ones only read), and `apply` must
 * rebuild the process's view of the whole mapping, byte for byte.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { release, tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { REPO_DIR } from "../../src/host/paths.js";

const MEMSNAP = join(REPO_DIR, "native", "memsnap", "forkd-memsnap");

const SCRIPT = `
import hashlib, json, mmap, os, subprocess, sys
memsnap, d = sys.argv[1], sys.argv[2]
psz, n = 4096, 2048
base = os.path.join(d, "base.mem")
with open(base, "wb") as f:
    f.write(os.urandom(psz * n))
fd = os.open(base, os.O_RDONLY)
m = mmap.mmap(fd, psz * n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
written = [0, 1, 2, 3, 100, 1000, 1001, 2047]
for p in written:
    m[p * psz + 5:p * psz + 9] = b"XYZW"
_ = m[500 * psz]  # only read: must stay the file's
pr = subprocess.Popen([memsnap, "capture", str(os.getpid()), base, os.path.join(d, "d.diff")],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
ready = json.loads(pr.stdout.readline())
# Between "ready" and "go" the set grows, as a running VM's does before its pause.
for p in (1500, 1501):
    m[p * psz] = 1
    written.append(p)
view = hashlib.sha256(m[:]).hexdigest()
pr.stdin.write("go\\n")
pr.stdin.flush()
stats = json.loads(pr.stdout.readline())
done = json.loads(pr.stdout.readline())
assert pr.wait() == 0
app = subprocess.run([memsnap, "apply", base, os.path.join(d, "d.diff"), os.path.join(d, "out.mem")],
                     capture_output=True, text=True, check=True)
out = hashlib.sha256(open(os.path.join(d, "out.mem"), "rb").read()).hexdigest()
print(json.dumps({"capture": stats, "ready": ready, "done": done, "apply": json.loads(app.stdout),
                  "same": out == view, "pages": len(written)}))
`;

/** PAGEMAP_SCAN came with Linux 6.7: on a kernel that has it, `auto` must use it. */
const HAS_PAGEMAP_SCAN = (() => {
  const [maj = 0, min = 0] = release().split(/[.-]/).map(Number);
  return maj > 6 || (maj === 6 && min >= 7);
})();

for (const how of ["read", "auto"] as const) {
  test(`capture takes exactly the private pages and apply rebuilds the mapping (pagemap ${how})`, async () => {
    const dir = await mkdtemp(join(tmpdir(), "forkd-memsnap-"));
    try {
      const { stdout } = await promisify(execFile)("python3", ["-c", SCRIPT, MEMSNAP, dir], {
        env: { ...process.env, FORKD_MEMSNAP_SCAN: how },
      });
      const r = JSON.parse(stdout) as {
        ready: { ready: boolean; estimate_bytes: number };
        done: { written: boolean };
        capture: { pages: number; runs: number; bytes: number; scan: string };
        apply: { bytes: number };
        same: boolean;
        pages: number;
      };
      assert.equal(r.ready.estimate_bytes, 8 * 4096, "the pre-scan sees the pages written so far");
      assert.equal(
        r.capture.pages,
        r.pages,
        "only the written pages are private, also those written after the pre-scan",
      );
      assert.equal(r.capture.runs, 5, "adjacent pages are coalesced into runs");
      assert.equal(r.done.written, true);
      assert.equal(r.apply.bytes, r.pages * 4096);
      assert.equal(r.same, true, "file + diff == the process's view");
      assert.equal(r.capture.scan, how === "read" || !HAS_PAGEMAP_SCAN ? "read" : "ioctl");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
}

test("bad input is refused with a clear message", async () => {
  const run = (args: string[]) =>
    promisify(execFile)(MEMSNAP, args).then(
      () => ({ code: 0, stderr: "" }),
      (e: { code: number; stderr: string }) => ({ code: e.code, stderr: e.stderr }),
    );
  assert.equal((await run([])).code, 2);
  assert.equal((await run(["capture", "x", "/dev/null", "/tmp/nope"])).code, 2);
  const notMapped = await run(["capture", String(process.pid), "/etc/hostname", "/tmp/forkd-never.diff"]);
  assert.equal(notMapped.code, 1);
  assert.match(notMapped.stderr, /does not map the memory file/);
  const notDiff = await run([
    "apply",
    "/etc/hostname",
    "/etc/hostname",
    join(tmpdir(), `forkd-x-${process.pid}`),
  ]);
  assert.equal(notDiff.code, 1);
  assert.match(notDiff.stderr, /not a forkd memory diff|truncated/);
  await rm(join(tmpdir(), `forkd-x-${process.pid}`), { force: true });
});

/* More separate runs than one PAGEMAP_SCAN call returns (4096): the walk restarts, and the diff
 * must be the pagemap read's, byte for byte. */
const MANY_RUNS = `
import hashlib, json, mmap, os, subprocess, sys
memsnap, d = sys.argv[1], sys.argv[2]
psz, n = 4096, 16384
base = os.path.join(d, "base.mem")
with open(base, "wb") as f:
    f.truncate(psz * n)
fd = os.open(base, os.O_RDONLY)
m = mmap.mmap(fd, psz * n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
for p in range(0, n, 3):
    _ = m[p * psz]
for p in range(0, n, 2):
    m[p * psz] = 7
out = {}
for how in ("read", "auto"):
    diff = os.path.join(d, how + ".diff")
    pr = subprocess.Popen([memsnap, "capture", str(os.getpid()), base, diff], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, env={**os.environ, "FORKD_MEMSNAP_SCAN": how})
    pr.stdout.readline()
    pr.stdin.write("go\\n")
    pr.stdin.flush()
    stats = json.loads(pr.stdout.readline())
    pr.stdout.readline()
    assert pr.wait() == 0
    out[how] = {"stats": stats, "sha": hashlib.sha256(open(diff, "rb").read()).hexdigest()}
print(json.dumps(out))
`;

test("a capture with more runs than one PAGEMAP_SCAN returns is the pagemap read's, byte for byte", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-memsnap-"));
  try {
    const { stdout } = await promisify(execFile)("python3", ["-c", MANY_RUNS, MEMSNAP, dir]);
    const r = JSON.parse(stdout) as Record<
      "read" | "auto",
      { stats: { pages: number; runs: number; scan: string }; sha: string }
    >;
    assert.equal(r.read.stats.pages, 8192);
    assert.equal(r.read.stats.runs, 8192);
    assert.equal(r.auto.stats.scan, HAS_PAGEMAP_SCAN ? "ioctl" : "read");
    assert.deepEqual(
      { pages: r.auto.stats.pages, runs: r.auto.stats.runs, sha: r.auto.sha },
      { pages: 8192, runs: 8192, sha: r.read.sha },
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
