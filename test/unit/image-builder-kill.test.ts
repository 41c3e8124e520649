/**
 * ImageBuilder runs build.sh in a process group of its own (no VM: a stand-in build.sh in a
 * temporary repository): on its timeout, on close() (the daemon stopping) and on an abort the
 * whole group is killed and the build settles, also when a child of the script (a `sleep`
 * here, tar or mkfs.ext4 in a real build) holds its stdout open; a script that exits leaving
 * such a child behind settles too, with its exit status.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inspect } from "node:util";
import { ImageBuilder } from "../../src/image/builder.js";
import { ForkdError } from "../../src/util/errors.js";

const dirs: string[] = [];
after(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

/** A repository whose build.sh is `body` (with $PIDS: where it writes its children's pids). */
async function repo(body: string): Promise<{ builder: ImageBuilder; pids: string }> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-builder-kill-"));
  dirs.push(dir);
  await mkdir(join(dir, "guest/image/templates"), { recursive: true });
  await writeFile(join(dir, "guest/image/templates/fake.packages"), "busybox\n");
  const pids = join(dir, "pids");
  await writeFile(join(dir, "guest/image/build.sh"), `PIDS=${pids}\n${body}\n`);
  const builder = new ImageBuilder(dir, join(dir, "cache"), { killGraceMs: 1_000 });
  return { builder, pids };
}

/** A stand-in build: a child holding stdout open, and the script waiting on another. */
const HANGS = [
  "sleep 1000 & echo $! >>$PIDS", // holds the build's stdout and stderr open
  "sleep 1000 & echo $! >>$PIDS",
  "wait",
].join("\n");

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

async function pidsOf(file: string, n: number): Promise<number[]> {
  for (;;) {
    const got = (await readFile(file, "utf8").catch(() => "")).split("\n").filter(Boolean).map(Number);
    if (got.length >= n) return got;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** `p` settled, or a failure once `ms` have passed (the old builder never settled). */
async function settledWithin<T>(p: Promise<T>, ms: number): Promise<PromiseSettledResult<T>> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the build had not settled after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([Promise.allSettled([p]).then((r) => r[0] as PromiseSettledResult<T>), bound]);
  } finally {
    clearTimeout(timer);
  }
}

async function gone(pids: number[]): Promise<void> {
  for (let i = 0; i < 100 && pids.some(alive); i++) await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(pids.filter(alive), [], "every process of the build's group is gone");
}

test("image builder: the timeout kills the build's whole process group and settles", async () => {
  const { builder, pids } = await repo(HANGS);
  const p = builder.ensure("fake", () => undefined, 500);
  const r = await settledWithin(p, 20_000);
  assert.equal(r.status, "rejected");
  assert.ok(
    r.status === "rejected" && r.reason instanceof ForkdError && r.reason.code === "timeout",
    inspect(r),
  );
  await gone(await pidsOf(pids, 2));
});

test("image builder: close() (the daemon stopping) and an abort kill the build's group", async () => {
  const a = await repo(HANGS);
  const p = a.builder.ensure("fake", () => undefined, 600_000);
  const children = await pidsOf(a.pids, 2);
  await settledWithin(a.builder.close(), 20_000);
  const r = await settledWithin(p, 1_000);
  assert.ok(
    r.status === "rejected" && r.reason instanceof ForkdError && r.reason.code === "unavailable",
    inspect(r),
  );
  await gone(children);
  await assert.rejects(a.builder.ensure("fake"), { code: "unavailable" }, "a closed builder starts no build");

  const b = await repo(HANGS);
  const abort = new AbortController();
  const q = b.builder.ensure("fake", () => undefined, 600_000, abort.signal);
  const kids = await pidsOf(b.pids, 2);
  abort.abort(new ForkdError("timeout", "the caller gave up"));
  const s = await settledWithin(q, 20_000);
  assert.ok(s.status === "rejected" && /the caller gave up/.test(inspect(s.reason)), inspect(s));
  await gone(kids);
});

test("image builder: a build that exits leaving a child holding its pipes settles with its status", async () => {
  const { builder, pids } = await repo(
    ["sleep 1000 & echo $! >>$PIDS", "echo 'build.sh: error: broken' >&2", "exit 3"].join("\n"),
  );
  const r = await settledWithin(
    builder.ensure("fake", () => undefined, 600_000),
    20_000,
  );
  assert.ok(
    r.status === "rejected" && /exit 3\): build\.sh: error: broken/.test(inspect(r.reason)),
    inspect(r),
  );
  await gone(await pidsOf(pids, 1));
});
