/**
 * The cache collector against a real daemon: a snapshot made through the API keeps forking
 * after `forkd cache gc` with a budget of 0 GiB deleted everything else of its cache. The
 * daemon gets a cache of its own (never the shared one: a collection there would take other
 * daemons' entries), whose images/ and stages/ are hard links of the shared cache's (no image
 * build: the image this tree's agent needs is usually there; deleting a link frees nothing of
 * the shared cache). Its entries are aged past the grace first, so only the snapshot's
 * reference can keep its image; the collection runs with another data directory than the
 * daemon's, so the daemon's own users/ record (or, failing it, its process) finds the snapshot.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { api, forkOne, sh } from "../helpers/vm.js";
import { CLI, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { steps } from "../helpers/steps.js";
import { exists } from "../../src/util/fs.js";

const run = promisify(execFile);
const { step, failed } = steps();
const SHARED = process.env.FORKD_CACHE_DIR ?? "/var/cache/forkd";
let d: TestDaemon;
let work: string;
let cache: string;
let imageDir: string;
/** The shared cache's images when the test began (linked into the daemon's cache). */
let sharedImages: string[] = [];
const FAKE = `dockerfile/images/${"f".repeat(64)}`;

interface GcJson {
  dry_run: boolean;
  freed_bytes: number;
  users: string[];
  evicted: Array<{ entry: string }>;
  kept: Array<{ entry: string; kept_by: string[] }>;
}

/** `forkd cache gc ARGS --json` on the daemon's cache, as another data directory's operator. */
async function gc(args: string[]): Promise<GcJson> {
  const { stdout } = await run(process.execPath, [CLI, "cache", "gc", ...args, "--json"], {
    env: { ...d.env, FORKD_DATA_DIR: join(work, "elsewhere") },
    timeout: 300_000,
    maxBuffer: 16 << 20,
  });
  return JSON.parse(stdout) as GcJson;
}

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-cachegc-it-"));
  cache = join(work, "cache");
  await mkdir(cache);
  sharedImages = await readdir(join(SHARED, "images")).catch(() => []);
  for (const area of ["images", "stages"]) {
    if (await exists(join(SHARED, area))) await run("cp", ["-al", join(SHARED, area), join(cache, area)]);
  }
  if (await exists(join(SHARED, "resolve")))
    await run("cp", ["-a", join(SHARED, "resolve"), join(cache, "resolve")]);
  d = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_CACHE_DIR: cache });
});

after(async () => {
  await d.destroy(failed());
  await rm(work, { recursive: true, force: true });
});

step("a snapshot made through the daemon names an image of its own cache", async () => {
  await api(d, "POST", "/v1/snapshots", { tag: "kept", memory_mib: 256, warm_eval: "kept = 41 + 1" });
  const meta = JSON.parse(await readFile(join(d.dataDir, "snapshots", "kept", "meta.json"), "utf8")) as {
    image: { dir: string };
  };
  imageDir = meta.image.dir;
  assert.ok(imageDir.startsWith(join(cache, "images") + "/"), imageDir);
  // The daemon recorded its data directory as a user of the cache.
  const users = await readdir(join(cache, "users"));
  const recorded = await Promise.all(users.map((u) => readFile(join(cache, "users", u), "utf8")));
  assert.ok(recorded.some((r) => (JSON.parse(r) as { dataDir: string }).dataDir === d.dataDir));
});

step("a dry run with a budget of 0 would delete all else and keep the snapshot's image", async () => {
  await mkdir(join(cache, FAKE), { recursive: true });
  await writeFile(join(cache, FAKE, "rootfs.ext4"), Buffer.alloc(1 << 20, 1));
  // Every entry last used two hours ago: the grace keeps none of them.
  const old = new Date(Date.now() - 2 * 3_600_000);
  for (const area of ["images", "stages", "dockerfile/images"]) {
    for (const name of await readdir(join(cache, area))) await utimes(join(cache, area, name), old, old);
  }
  const r = await gc(["--dry-run", "--max-gib", "0"]);
  assert.equal(r.dry_run, true);
  assert.ok(r.users.includes(d.dataDir), JSON.stringify(r.users));
  const id = imageDir.slice(cache.length + 1);
  const kept = r.kept.find((e) => e.entry === id);
  assert.ok(kept?.kept_by.includes(`snapshot kept of ${d.dataDir}`), JSON.stringify(kept));
  assert.ok(!r.evicted.some((e) => e.entry === id));
  assert.ok(r.evicted.some((e) => e.entry === FAKE));
  assert.equal(await exists(join(cache, FAKE)), true, "a dry run deletes nothing");
});

step("after a collection with a budget of 0 the snapshot still forks and runs", async () => {
  const r = await gc(["--max-gib", "0"]);
  assert.equal(r.dry_run, false);
  assert.ok(r.evicted.some((e) => e.entry === FAKE));
  assert.equal(await exists(join(cache, FAKE)), false);
  assert.equal(await exists(join(imageDir, "rootfs.ext4")), true);
  // What is left of the cache: the snapshot's image, nothing else of images/ or dockerfile/.
  assert.deepEqual(await readdir(join(cache, "images")), [imageDir.slice(join(cache, "images").length + 1)]);
  const id = await forkOne(d, "kept");
  assert.equal((await sh(d, id, "echo forked-after-gc")).trim(), "forked-after-gc");
  const ev = await api<{ value: string }>(d, "POST", `/v1/sandboxes/${id}/eval`, { code: "kept" });
  assert.equal(ev.value, "42");
  await api(d, "DELETE", `/v1/sandboxes/${id}`);
  // The shared cache lost nothing: the links deleted were this test's own.
  for (const name of sharedImages)
    assert.equal(await exists(join(SHARED, "images", name, "manifest.json")), true, name);
});
