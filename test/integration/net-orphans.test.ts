/**
 * A starting daemon removes the network instance of a data directory that no longer exists
 * (namespaces, host interfaces, nft table, owner marker: src/net/owners.ts), and nothing else:
 * not an instance whose data directory exists, not one without a marker (an older daemon's).
 * The instances are made here by hand, under ids no one on this host uses. No VM is started.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { forgetOwner, OWNERS_DIR, recordOwner } from "../../src/net/owners.js";
import { teardownInstance } from "../../src/net/pool.js";
import { instanceOf } from "../../src/net/slots.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { instanceState } from "../helpers/net-state.js";

const run = promisify(execFile);
const ROOT = process.getuid?.() === 0;
let failed = false;
let d: TestDaemon | undefined;
let work = "";
/** Three unused ids: an orphan, one whose data dir exists, one without a marker. */
let ids: { orphan: string; alive: string; unmarked: string };

async function unusedIds(n: number): Promise<string[]> {
  const taken = new Set((await readdir(OWNERS_DIR).catch(() => [] as string[])).map((x) => x));
  for (const name of await readdir("/run/netns").catch(() => [] as string[])) {
    const m = /^forkd-([0-9a-f]{4})-/.exec(name);
    if (m?.[1]) taken.add(m[1]);
  }
  const out: string[] = [];
  for (let i = 0xf000; out.length < n && i <= 0xffff; i++) {
    const id = i.toString(16);
    if (!taken.has(id) && (await instanceState(id)).length === 0) out.push(id);
  }
  return out;
}

/** What a daemon of instance `id` leaves: one slot namespace, its host veth, the host table. */
async function fakeInstance(id: string): Promise<void> {
  await run("ip", ["netns", "add", `forkd-${id}-0`]);
  await run("ip", [
    "link",
    "add",
    `fk${id}h0`,
    "type",
    "veth",
    "peer",
    "name",
    "veth0",
    "netns",
    `forkd-${id}-0`,
  ]);
  await run("nft", ["add", "table", "inet", `forkd_${id}`]);
}

before(async () => {
  if (!ROOT) return;
  work = await mkdtemp(join(tmpdir(), "forkd-orphans-"));
  const [orphan, alive, unmarked] = await unusedIds(3);
  assert.ok(orphan && alive && unmarked, "three unused instance ids");
  ids = { orphan, alive, unmarked };
  for (const id of [orphan, alive, unmarked]) await fakeInstance(id);
  await recordOwner(orphan, join(work, "deleted-data-dir"));
  await recordOwner(alive, work);
});

after(async () => {
  await d?.destroy(failed);
  if (work) {
    for (const id of Object.values(ids)) {
      await teardownInstance(instanceOf(id, 1, {}));
      await forgetOwner(id);
    }
    await rm(work, { recursive: true, force: true });
  }
});

test(
  "a starting daemon removes the instance of a deleted data dir, and only that one",
  { skip: ROOT ? false : "network namespaces need root" },
  async () => {
    try {
      assert.equal((await instanceState(ids.orphan)).length, 3);
      d = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_NET_SLOTS: "0" });
      assert.deepEqual(
        await instanceState(ids.orphan),
        [],
        "the orphan's namespace, veth and table are gone",
      );
      assert.ok(!(await readdir(OWNERS_DIR)).includes(ids.orphan), "and its marker");
      assert.equal((await instanceState(ids.alive)).length, 3, "an instance whose data dir exists stays");
      assert.equal((await instanceState(ids.unmarked)).length, 3, "an instance without a marker stays");
      const log = await readFile(join(d.dataDir, "daemon.log"), "utf8");
      assert.match(
        log,
        new RegExp(`removing the slots of a data directory that no longer exists.*"${ids.orphan}"`),
      );
    } catch (e) {
      failed = true;
      throw e;
    }
  },
);
