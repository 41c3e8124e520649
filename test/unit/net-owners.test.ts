/**
 * Network instance owners (src/net/owners.ts): an instance is an orphan only when the data
 * directory its marker names is gone and no daemon holds that directory's lock.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { acquireDaemonLock } from "../../src/host/daemon-lock.js";
import { forgetOwner, orphanInstances, recordOwner } from "../../src/net/owners.js";

let dir = "";
before(async () => {
  dir = await mkdtemp(join(tmpdir(), "forkd-owners-"));
});
after(async () => {
  await rm(dir, { recursive: true, force: true });
});

test("orphans: a gone data dir nobody holds; not a live one, a held one, our own, or an unreadable marker", async () => {
  const markers = join(dir, "net");
  const alive = join(dir, "alive");
  await mkdir(alive);
  const goneDir = join(dir, "gone");
  const held = join(dir, "held-but-gone");
  await recordOwner("aaaa", alive, markers);
  await recordOwner("bbbb", goneDir, markers);
  await recordOwner("cccc", held, markers);
  await recordOwner("dddd", join(dir, "also-gone"), markers);
  await writeFile(join(markers, "eeee"), "not json");
  await writeFile(join(markers, "not-an-id"), JSON.stringify({ data_dir: join(dir, "x") }));
  const release = await acquireDaemonLock(held);
  try {
    const found = await orphanInstances("dddd", markers);
    assert.deepEqual(found, [{ id: "bbbb", dataDir: goneDir }]);
  } finally {
    await release();
  }
  assert.deepEqual(
    (await orphanInstances("dddd", markers)).map((o) => o.id),
    ["bbbb", "cccc"],
    "a released lock leaves the gone directory an orphan",
  );
  await forgetOwner("bbbb", markers);
  assert.ok(!(await readdir(markers)).includes("bbbb"));
  assert.deepEqual(await orphanInstances("zzzz", join(dir, "missing")), [], "no marker directory: none");
});
