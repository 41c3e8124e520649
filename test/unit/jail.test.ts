import assert from "node:assert/strict";
import { chmod, mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { hideRoots, jailEnabled, jailOptions } from "../../src/vmm/jail.js";

test("hidden directories: a non-traversable ancestor is hidden whole; nested ones fold", async () => {
  const top = await mkdtemp(join(tmpdir(), "forkd-jail-"));
  try {
    await chmod(top, 0o755);
    const closed = join(top, "closed");
    const open = join(top, "open");
    await mkdir(join(closed, "data"), { recursive: true });
    await mkdir(join(open, "cache", "inner"), { recursive: true });
    await chmod(closed, 0o700);
    assert.deepEqual(await hideRoots([join(closed, "data"), join(open, "cache")]), [
      closed,
      join(open, "cache"),
    ]);
    assert.deepEqual(await hideRoots([join(open, "cache", "inner"), join(open, "cache")]), [
      join(open, "cache"),
    ]);
  } finally {
    await rm(top, { recursive: true, force: true });
  }
});

test("FORKD_JAIL=off, or a daemon that is not root, jails nothing", () => {
  assert.equal(jailEnabled({ FORKD_JAIL: "off" }), false);
  assert.equal(jailEnabled({}), process.getuid?.() === 0);
  assert.deepEqual(jailOptions({ base: 5000000, count: 100 }, 4000, ["/x"], [7]), {
    uidBase: 5000000,
    uidCount: 100,
    gid: 4000,
    hide: ["/x"],
    groups: [7],
  });
});
