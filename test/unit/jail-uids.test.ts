import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import {
  BLOCK,
  BLOCKS,
  FLOOR,
  blockRange,
  blocksOf,
  claimBlocks,
  claimUidRange,
  derivedBlock,
  DEFAULT_JAIL_GID,
  foreignIn,
  hostProcesses,
  jailGid,
  overlaps,
  parseUidRange,
} from "../../src/vmm/jail-uids.js";
import type { HostProcess } from "../../src/vmm/jail-uids.js";

const withDirs = async (n: number, fn: (dirs: string[]) => Promise<void>) => {
  const dirs = await Promise.all(Array.from({ length: n }, () => mkdtemp(join(tmpdir(), "forkd-uids-"))));
  try {
    await fn(dirs);
  } finally {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  }
};

test("a data directory's uid range: derived from its path, one block, clear of the old shared range", () => {
  const a = blockRange(derivedBlock("/var/lib/forkd"));
  assert.deepEqual(blockRange(derivedBlock("/var/lib/forkd")), a, "the same directory, the same range");
  assert.notDeepEqual(blockRange(derivedBlock("/var/lib/forkd-2")), a);
  for (const dir of ["/", "/a", "/tmp/forkd-it-x", "/var/lib/forkd"]) {
    const r = blockRange(derivedBlock(dir));
    assert.ok(r.base >= FLOOR && r.base + r.count < 2 ** 31, `${dir}: ${r.base}`);
    assert.equal(r.count, BLOCK - 1);
    assert.equal(overlaps(r, { base: 1_900_000_000, count: 65_536 }), false);
    assert.deepEqual(blocksOf(r), [r.base / BLOCK]);
  }
  // Blocks never overlap each other.
  assert.equal(overlaps(blockRange(0), blockRange(1)), false);
  assert.equal(overlaps(blockRange(BLOCKS - 1), blockRange(BLOCKS - 2)), false);
  assert.equal(overlaps({ base: 100, count: 10 }, { base: 110, count: 5 }), true, "the gid counts");
  assert.deepEqual(blocksOf({ base: BLOCK - 1, count: BLOCK + 1 }), [0, 1, 2]);
});

test("FORKD_JAIL_UIDS is validated", () => {
  assert.deepEqual(parseUidRange("5000000:100"), { base: 5000000, count: 100 });
  for (const bad of ["0:10", "5000:0", "abc", "4294967290:100"])
    assert.throws(() => parseUidRange(bad), /FORKD_JAIL_UIDS/);
});

test("the jail gid is every daemon's (they share the image cache), never one of the VMMs' uids", () => {
  const r = blockRange(derivedBlock("/var/lib/forkd"));
  assert.equal(jailGid({}, r), DEFAULT_JAIL_GID);
  assert.equal(
    jailGid({}, blockRange(derivedBlock("/other"))),
    DEFAULT_JAIL_GID,
    "the same for another daemon",
  );
  assert.equal(jailGid({ FORKD_JAIL_GID: "4242" }, r), 4242);
  for (const bad of ["12", "x", String(r.base + 1), String(r.base + r.count)])
    assert.throws(() => jailGid({ FORKD_JAIL_GID: bad }, r), /FORKD_JAIL_GID/);
  assert.equal(overlaps(r, { base: DEFAULT_JAIL_GID, count: 65_536 }), false);
});

test("two data directories never get overlapping ranges; a restarted daemon keeps its own", async () => {
  await withDirs(3, async ([a, b, c]) => {
    const ra = await claimUidRange(a!, {}, []);
    try {
      assert.deepEqual({ base: ra.base, count: ra.count }, blockRange(derivedBlock(a!)));
      // b's derived block is held by someone else: b takes the next free one.
      const taken = await claimBlocks(blockRange(derivedBlock(b!)));
      assert.ok(taken);
      const rb = await claimUidRange(b!, {}, []);
      try {
        assert.equal(rb.base, blockRange((derivedBlock(b!) + 1) % BLOCKS).base);
        assert.equal(overlaps(ra, rb), false);
        // The choice is recorded: once b's daemon is back, it keeps it though its derived block is free.
        await rb.release();
        await taken();
        const again = await claimUidRange(b!, {}, []);
        assert.equal(again.base, rb.base);
        await again.release();
        assert.deepEqual(JSON.parse(await readFile(join(b!, "jail-uids.json"), "utf8")), {
          base: rb.base,
          count: rb.count,
        });
      } finally {
        await rb.release();
        await taken().catch(() => undefined);
      }
      // An explicit range overlapping a claimed one is refused, naming why.
      await assert.rejects(
        claimUidRange(c!, { FORKD_JAIL_UIDS: `${ra.base + 10}:100` }, []),
        /FORKD_JAIL_UIDS .* overlaps uids in use: another forkd daemon claims it/,
      );
    } finally {
      await ra.release();
    }
    // Released: the range can be claimed again.
    const rc = await claimUidRange(c!, { FORKD_JAIL_UIDS: `${ra.base + 10}:100` }, []);
    assert.equal(rc.base, ra.base + 10);
    await rc.release();
  });
});

test("a block some other process runs as is not taken (a VMM of a stopped daemon)", async () => {
  await withDirs(1, async ([a]) => {
    const r0 = blockRange(derivedBlock(a!));
    const procs: HostProcess[] = [
      { pid: 4242, uid: r0.base + 7, ours: false },
      { pid: 4343, uid: r0.base + 4096 + 9, ours: true },
    ];
    assert.equal(foreignIn(r0, procs)?.pid, 4242);
    const r = await claimUidRange(a!, {}, procs);
    try {
      assert.notEqual(r.base, r0.base);
      assert.equal(foreignIn(r, procs), undefined);
    } finally {
      await r.release();
    }
    // Its own VMMs (command line under its data directory) do not stand in its way.
    await withDirs(1, async ([b]) => {
      const rb0 = blockRange(derivedBlock(b!));
      const rb = await claimUidRange(b!, {}, [{ pid: 1, uid: rb0.base + 1, ours: true }]);
      assert.equal(rb.base, rb0.base);
      await rb.release();
    });
    await assert.rejects(
      claimUidRange(a!, { FORKD_JAIL_UIDS: `${r0.base}:10` }, procs),
      /overlaps uids in use: process 4242 runs as uid/,
    );
  });
});

test("host processes: a process naming a path under the data directory is its own", async (t) => {
  if (process.getuid?.() !== 0) return t.skip("needs root (runs a process as a jail uid)");
  await withDirs(2, async ([a, b]) => {
    const uid = blockRange(derivedBlock(a!)).base + 1;
    // Like a VMM: its data directory only inside an argument (`path=...`).
    const child = spawn(
      "setpriv",
      [
        `--reuid=${uid}`,
        `--regid=${uid}`,
        "--clear-groups",
        "--",
        "sh",
        "-c",
        "sleep 30",
        `path=${a}/sandboxes/x/qmp.sock,server=on`,
      ],
      { stdio: "ignore" },
    );
    try {
      let mine: HostProcess | undefined;
      for (let i = 0; i < 500 && !mine; i++) {
        mine = (await hostProcesses(a!)).find((p) => p.pid === child.pid && p.uid === uid);
        if (!mine) await new Promise((r) => setTimeout(r, 20));
      }
      assert.equal(mine?.ours, true);
      const other = (await hostProcesses(b!)).find((p) => p.pid === child.pid);
      assert.equal(other?.ours, false, "another data directory's");
      assert.equal(foreignIn(blockRange(derivedBlock(a!)), await hostProcesses(b!))?.pid, child.pid);
    } finally {
      child.kill("SIGKILL");
    }
  });
});
