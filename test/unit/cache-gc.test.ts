/**
 * The cache collector (src/cache/), on throwaway cache and data directories with fake entries
 * and fake snapshots (no VM): what a snapshot of a live data directory names stays (by its
 * meta.json and by its disk's backing file), a data directory that is gone keeps nothing (its
 * record dropped), a live pin keeps its entry and a dead process's does not, an image build
 * holding the cache's lock stops a collection (and one waiting behind it keeps what the build
 * made), a kept Dockerfile layer keeps the chain it stands on, a budget evicts the least
 * recently used first with what is stacked on them, a dry run deletes nothing, hard links are
 * counted once; a daemon's keeper records its data directory and collects to its budget.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { link, mkdir, mkdtemp, open, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { collect } from "../../src/cache/collect.js";
import type { CollectResult } from "../../src/cache/collect.js";
import { takeFlock } from "../../src/cache/flock.js";
import { CacheKeeper, cacheSettingsFromEnv } from "../../src/cache/keeper.js";
import { CachePins, pinsDir } from "../../src/cache/pins.js";
import { qcow2Backing } from "../../src/cache/qcow2-backing.js";
import { registerUser, usersDir } from "../../src/cache/users.js";
import { createOverlay } from "../../src/disk/overlay.js";
import { exists } from "../../src/util/fs.js";
import type { Logger } from "../../src/util/log.js";

const MIB = 1 << 20;
const hex = (c: string) => c.repeat(64);
const ids = (r: CollectResult) => r.evict.map((e) => e.id).sort();
const HOUR = 3_600_000;

interface World {
  cache: string;
  data: string;
  root: string;
}

async function world(): Promise<World> {
  const root = await mkdtemp(join(tmpdir(), "forkd-cachegc-"));
  const cache = join(root, "cache");
  const data = join(root, "data");
  await mkdir(join(data, "snapshots"), { recursive: true });
  await mkdir(cache);
  return { cache, data, root };
}

/** An image entry with a `mib` MiB root filesystem, last used `ageMs` ago. */
async function image(w: World, area: string, name: string, mib: number, ageMs: number): Promise<string> {
  const dir = join(w.cache, area, name);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, "rootfs.ext4"), randomBytes(mib * MIB));
  await writeFile(join(dir, "manifest.json"), "{}\n");
  await age(dir, ageMs);
  return dir;
}

async function age(path: string, ageMs: number): Promise<void> {
  const t = new Date(Date.now() - ageMs);
  await utimes(path, t, t);
}

/** A snapshot of `data` whose meta names `imageDir` and whose disk is backed by its rootfs. */
async function snapshot(
  data: string,
  tag: string,
  imageDir: string,
  o: { meta?: boolean } = {},
): Promise<void> {
  const dir = join(data, "snapshots", tag);
  await mkdir(dir, { recursive: true });
  if (o.meta !== false)
    await writeFile(join(dir, "meta.json"), JSON.stringify({ tag, image: { dir: imageDir } }));
  await createOverlay(join(dir, "disk.qcow2"), {
    backing: join(imageDir, "rootfs.ext4"),
    backingFormat: "raw",
    sizeBytes: 64 * MIB,
  });
}

/** A Dockerfile step layer backed by `backing`. */
async function layer(
  w: World,
  key: string,
  backing: string,
  format: "raw" | "qcow2",
  ageMs: number,
): Promise<string> {
  const dir = join(w.cache, "dockerfile", "layers", key);
  await mkdir(dir, { recursive: true });
  await createOverlay(join(dir, "layer.qcow2"), {
    backing,
    backingFormat: format,
    sizeBytes: 64 * MIB,
  });
  await writeFile(join(dir, "step.json"), "{}\n");
  await age(dir, ageMs);
  return dir;
}

const gc = (w: World, o: Partial<Parameters<typeof collect>[1]> = {}) =>
  collect(w.cache, { dryRun: false, budgetBytes: null, graceMs: 0, dataDirs: [], ...o });

test("qcow2Backing reads the backing file a layer names", async () => {
  const w = await world();
  try {
    const img = await image(w, "images", hex("a"), 1, 0);
    await snapshot(w.data, "s", img);
    assert.equal(await qcow2Backing(join(w.data, "snapshots", "s", "disk.qcow2")), join(img, "rootfs.ext4"));
    assert.equal(await qcow2Backing(join(img, "rootfs.ext4")), null);
    assert.equal(await qcow2Backing(join(w.root, "missing")), null);
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});

test("entries a live data directory's snapshots name are kept; a gone data directory keeps nothing", async () => {
  const w = await world();
  const other = join(w.root, "other-data");
  try {
    const used = await image(w, "images", hex("a"), 1, HOUR);
    const byDisk = await image(w, "imported", hex("b"), 1, HOUR);
    const ofGone = await image(w, "images", hex("c"), 1, HOUR);
    const unused = await image(w, "dockerfile/images", hex("d"), 1, HOUR);
    await registerUser(w.cache, w.data);
    await snapshot(w.data, "by-meta", used);
    // A snapshot whose meta.json is unreadable is still kept by its disk's backing file.
    await snapshot(w.data, "by-disk", byDisk, { meta: false });
    await mkdir(join(other, "snapshots"), { recursive: true });
    await registerUser(w.cache, other);
    await snapshot(other, "gone-soon", ofGone);
    await rm(other, { recursive: true, force: true }); // its data directory is gone: a stale record

    const r = await gc(w);
    assert.deepEqual(ids(r), [`dockerfile/images/${hex("d")}`, `images/${hex("c")}`]);
    assert.equal(await exists(used), true);
    assert.equal(await exists(byDisk), true);
    assert.equal(await exists(ofGone), false);
    assert.equal(await exists(unused), false);
    assert.deepEqual(r.users, [w.data]);
    assert.deepEqual(r.staleUsers, [other]);
    assert.equal((await readdir(usersDir(w.cache))).length, 1, "the stale record is dropped");
    const kept = r.kept.find((e) => e.id === `images/${hex("a")}`);
    assert.deepEqual(kept?.reasons, [{ why: "snapshot", dataDir: w.data, tag: "by-meta" }]);
    // Nothing left behind in the cache root but the locks and records.
    assert.deepEqual(
      (await readdir(w.cache)).filter((n) => n.startsWith(".gc-trash")),
      [],
    );
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});

test("a dry run deletes nothing and says what a collection would delete", async () => {
  const w = await world();
  try {
    const a = await image(w, "images", hex("a"), 1, HOUR);
    const b = await image(w, "stages", `final-${hex("b")}`, 1, HOUR);
    const dry = await gc(w, { dryRun: true });
    assert.deepEqual(ids(dry), [`images/${hex("a")}`, `stages/final-${hex("b")}`]);
    assert.ok(dry.freedBytes >= 2 * MIB);
    assert.equal(await exists(a), true);
    assert.equal(await exists(b), true);
    const real = await gc(w);
    assert.deepEqual(ids(real), ids(dry));
    assert.equal(real.freedBytes, dry.freedBytes);
    assert.equal(await exists(a), false);
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});

test("pins: a live process's pin keeps its entry, a dead one's is stale; a pin of a collected entry says so", async () => {
  const w = await world();
  try {
    const pinned = await image(w, "images", hex("a"), 1, HOUR);
    const dead = await image(w, "images", hex("b"), 1, HOUR);
    const pins = new CachePins(w.cache, w.data);
    const scope = pins.scope();
    assert.equal(await scope.pin(join(pinned, "rootfs.ext4")), true);
    // A pin of a process that no longer runs (pid 2^22 - 1 is above the default pid_max here).
    await writeFile(
      join(pinsDir(w.cache), "4194303-dead.json"),
      JSON.stringify({
        format: "forkd-cache-pin/1",
        entry: `images/${hex("b")}`,
        pid: 4194303,
        start: 1,
        dataDir: w.data,
        since: new Date().toISOString(),
      }),
    );
    // Pinning touched the entry (its last use): without a grace it is kept by the pin alone.
    const r = await gc(w);
    assert.deepEqual(ids(r), [`images/${hex("b")}`]);
    assert.equal(r.stalePins, 1);
    assert.equal(await exists(pinned), true);
    assert.equal(await exists(dead), false);
    assert.deepEqual(
      r.kept.find((e) => e.id === `images/${hex("a")}`)?.reasons.map((x) => x.why),
      ["pin"],
    );
    // Released: the next collection takes it.
    await scope.release();
    assert.deepEqual(ids(await gc(w)), [`images/${hex("a")}`]);
    // Pinning what was collected: false (the caller builds it again), nothing written.
    assert.equal(await pins.scope().pin(join(pinned, "rootfs.ext4")), false);
    assert.deepEqual(await readdir(pinsDir(w.cache)), []);
    // A path outside every entry needs no pin.
    assert.equal(await pins.scope().pin(join(w.cache, "resolve", "x")), true);
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});

test("an image build holding the cache's lock stops a collection; one waiting behind it keeps what the build made", async () => {
  const w = await world();
  try {
    const old = await image(w, "images", hex("a"), 1, HOUR);
    // build.sh holds <cache>/.lock while it builds (here: another holder of the same flock).
    const build = await takeFlock(join(w.cache, ".lock"), { shared: false, waitMs: 0 });
    assert.ok(build);
    const busy = await gc(w, { waitMs: 0 });
    assert.ok(busy.busy);
    assert.deepEqual(ids(busy), []);
    assert.equal(await exists(old), true);
    // A collection waiting for the build, with the default grace.
    const waiting = gc(w, { waitMs: 20_000, graceMs: 30 * 60_000 });
    // The build: its work in tmp-* (never an entry), then its image renamed into place.
    const tmp = join(w.cache, "tmp-build1");
    await mkdir(tmp);
    await writeFile(join(tmp, "rootfs.ext4"), randomBytes(MIB));
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(await exists(tmp), true, "nothing is collected while the build holds the lock");
    await mkdir(join(w.cache, "images", hex("n")));
    await writeFile(join(w.cache, "images", hex("n"), "manifest.json"), "{}\n");
    await build.release();
    const r = await waiting;
    assert.equal(r.busy, undefined);
    assert.deepEqual(ids(r), [`images/${hex("a")}`]);
    assert.equal(
      await exists(join(w.cache, "images", hex("n"))),
      true,
      "the build's fresh image is kept (recent)",
    );
    assert.equal(await exists(tmp), true, "a build's working directory is never touched");
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});

test("a kept Dockerfile layer keeps the chain under it; an evicted base goes with the layers on it", async () => {
  const w = await world();
  try {
    const base = await image(w, "images", hex("a"), 1, HOUR);
    const l1 = await layer(w, hex("1"), join(base, "rootfs.ext4"), "raw", HOUR);
    const l2 = await layer(w, hex("2"), join(l1, "layer.qcow2"), "qcow2", HOUR);
    const base2 = await image(w, "images", hex("b"), 1, 3 * HOUR);
    const m1 = await layer(w, hex("3"), join(base2, "rootfs.ext4"), "raw", HOUR / 2);
    // A build in progress stands on l2 (its pin); nothing stands on base2's chain.
    const scope = new CachePins(w.cache, w.data).scope();
    assert.equal(await scope.pin(l2), true);
    const r = await gc(w);
    assert.deepEqual(ids(r), [`dockerfile/layers/${hex("3")}`, `images/${hex("b")}`]);
    // The layer stacked on base2 goes before it (never a layer naming a deleted file).
    assert.deepEqual(
      r.evict.map((e) => e.id),
      [`dockerfile/layers/${hex("3")}`, `images/${hex("b")}`],
    );
    for (const p of [base, l1, l2]) assert.equal(await exists(p), true, p);
    assert.equal(await exists(m1), false);
    const why = (id: string) => r.kept.find((e) => e.id === id)?.reasons.map((x) => x.why);
    assert.deepEqual(why(`dockerfile/layers/${hex("1")}`), ["backing"]);
    assert.deepEqual(why(`images/${hex("a")}`), ["backing"]);
    await scope.release();
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});

test("a budget evicts least recently used first, stops once under it, and counts hard links once", async () => {
  const w = await world();
  try {
    const oldest = await image(w, "images", hex("a"), 2, 5 * HOUR);
    const older = await image(w, "images", hex("b"), 2, 4 * HOUR);
    const newer = await image(w, "images", hex("c"), 2, 3 * HOUR);
    const used = await image(w, "images", hex("d"), 2, 6 * HOUR); // the oldest, but in use
    // The used image's final stage shares its root filesystem (a hard link).
    const stage = join(w.cache, "stages", `final-${hex("d")}`);
    await mkdir(stage, { recursive: true });
    await link(join(used, "rootfs.ext4"), join(stage, "rootfs.ext4"));
    await age(stage, 7 * HOUR);
    await registerUser(w.cache, w.data);
    await snapshot(w.data, "s", used);
    const dry = await gc(w, { dryRun: true });
    const total = dry.totalBytes;
    assert.ok(total >= 8 * MIB && total < 9 * MIB, `the shared file is counted once: ${total}`);
    // Room for all but ~3 MiB: the stage (frees nothing: its file is the used image's), then the
    // two least recently used images.
    const r = await gc(w, { budgetBytes: total - 3 * MIB });
    assert.deepEqual(
      r.evict.map((e) => e.id),
      [`stages/final-${hex("d")}`, `images/${hex("a")}`, `images/${hex("b")}`],
    );
    assert.ok(r.afterBytes <= total - 3 * MIB);
    assert.ok(r.freedBytes >= 4 * MIB && r.freedBytes < 5 * MIB, `${r.freedBytes}`);
    assert.equal(await exists(oldest), false);
    assert.equal(await exists(older), false);
    assert.equal(await exists(newer), true);
    assert.equal(await exists(join(used, "rootfs.ext4")), true);
    // A budget already met: nothing goes.
    assert.deepEqual(ids(await gc(w, { budgetBytes: r.afterBytes })), []);
    // Even a budget of 0 never takes what a snapshot names.
    const zero = await gc(w, { budgetBytes: 0 });
    assert.deepEqual(ids(zero), [`images/${hex("c")}`]);
    assert.equal(await exists(join(used, "rootfs.ext4")), true);
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});

test("an entry recently used, or with a file open, stays", async () => {
  const w = await world();
  try {
    const recent = await image(w, "images", hex("a"), 1, 60_000);
    const opened = await image(w, "oci/rootfs/sha256", hex("b"), 1, HOUR);
    const layerTar = join(w.cache, "oci", "layers", "sha256", `${hex("c")}.tar`);
    await mkdir(join(w.cache, "oci", "layers", "sha256"), { recursive: true });
    await writeFile(layerTar, randomBytes(MIB));
    await age(layerTar, HOUR);
    const fh = await open(join(opened, "rootfs.ext4"), "r");
    try {
      const r = await gc(w, { graceMs: 30 * 60_000 });
      assert.deepEqual(ids(r), [`oci/layers/sha256/${hex("c")}.tar`]);
      assert.equal(await exists(recent), true);
      assert.equal(await exists(opened), true);
      assert.equal(await exists(layerTar), false);
      const why = (id: string) => r.kept.find((e) => e.id === id)?.reasons.map((x) => x.why);
      assert.deepEqual(why(`images/${hex("a")}`), ["recent"]);
      assert.deepEqual(why(`oci/rootfs/sha256/${hex("b")}`), ["open"]);
    } finally {
      await fh.close();
    }
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});

test("a daemon's keeper records its data directory and collects down to FORKD_CACHE_MAX_GIB", async () => {
  const w = await world();
  try {
    const used = await image(w, "images", hex("a"), 2, 2 * HOUR);
    const old = await image(w, "images", hex("b"), 2, 3 * HOUR);
    const fresh = await image(w, "images", hex("c"), 2, 60_000);
    await snapshot(w.data, "s", used);
    const settings = cacheSettingsFromEnv({ FORKD_CACHE_MAX_GIB: "0", FORKD_CACHE_GRACE_S: "600" });
    assert.deepEqual(settings, { budgetBytes: 0, graceMs: 600_000 });
    assert.throws(() => cacheSettingsFromEnv({ FORKD_CACHE_MAX_GIB: "lots" }), /FORKD_CACHE_MAX_GIB/);
    assert.deepEqual(cacheSettingsFromEnv({}).budgetBytes, null);
    const lines: string[] = [];
    const log = {
      info: (m: string) => lines.push(m),
      warn: (m: string) => lines.push(m),
    } as unknown as Logger;
    const keeper = new CacheKeeper(w.cache, w.data, settings, log);
    await keeper.start();
    await keeper.idle();
    assert.equal(await exists(old), false);
    assert.equal(await exists(used), true, "a snapshot of its data directory names it");
    assert.equal(await exists(fresh), true, "used within the grace");
    assert.deepEqual(lines, ["cache collected"]);
    // Recorded: a collection run from elsewhere (no data directory of its own) keeps it too.
    assert.deepEqual(ids(await gc(w, { graceMs: 0 })), [`images/${hex("c")}`]);
    assert.equal(await exists(used), true);
    await keeper.close();
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});
