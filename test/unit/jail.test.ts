import assert from "node:assert/strict";
import { chmod, mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { hideRoots, jailOptionsFromEnv } from "../../src/vmm/jail.js";

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

test("FORKD_JAIL_UIDS is validated; FORKD_JAIL=off disables the jail", () => {
  if (process.getuid?.() !== 0) return; // only root jails
  const o = jailOptionsFromEnv({ FORKD_JAIL_UIDS: "5000000:100" }, ["/x"], []);
  assert.deepEqual(o, { uidBase: 5000000, uidCount: 100, hide: ["/x"], groups: [] });
  assert.equal(jailOptionsFromEnv({ FORKD_JAIL: "off" }, [], []), null);
  for (const bad of ["0:10", "5000:0", "abc", "4294967290:100"])
    assert.throws(() => jailOptionsFromEnv({ FORKD_JAIL_UIDS: bad }, [], []), /FORKD_JAIL_UIDS/);
});
