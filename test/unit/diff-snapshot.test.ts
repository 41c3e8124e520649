/**
 * Diff snapshots without a VM: a branch whose memory is a forkd-memsnap diff over its memory
 * base's image (format 3). The store resolves its `files.memory` to the base's image and its
 * `memoryDiff` to its own diff, refuses a base that changed or is gone, counts the diff (not a
 * phantom image) as its size, and keeps a base that diffs need; compact and a forced delete
 * build a full image = base + diff (byte for byte); a pack carries the base's image and the
 * diffs and registers them on another store, checked against the metadata.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { copyFile, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { compactSnapshot, deleteSnapshot } from "../../src/snapshot/chain.js";
import { applyMemoryDiff } from "../../src/snapshot/memory-diff.js";
import {
  readMeta,
  sha256File,
  SNAPSHOT_FORMAT,
  SNAPSHOT_FORMAT_DIFF,
  writeMeta,
} from "../../src/snapshot/meta.js";
import { stagePack, parsePackManifest } from "../../src/snapshot/pack.js";
import { registerStaged } from "../../src/snapshot/register.js";
import { memoryDiffFile, SnapshotStore } from "../../src/snapshot/store.js";
import { ForkdError } from "../../src/util/errors.js";
import { PAGES, PSZ, baseSnapshot, diffOf, diffSnapshot, scratch } from "../helpers/fake-chain.js";
import type { Scratch } from "../helpers/fake-chain.js";
import { testTools } from "../helpers/tools.js";

// qemu-img on the layers runs as the daemon runs it: jailed when root.
const { tools, release } = await testTools();
after(release);
/** `base` with `runs` written over it: what a child of the diff snapshot sees. */
function expected(base: Buffer, runs: Array<{ page: number; data: Buffer }>): Buffer {
  const out = Buffer.from(base);
  for (const r of runs) r.data.copy(out, r.page * PSZ);
  return out;
}

const MEM = Buffer.alloc(PSZ * PAGES, 0x11);
const RUNS1 = [{ page: 3, data: Buffer.alloc(PSZ * 2, 0xaa) }];
// Cumulative: the branch of a child of b1 holds b1's pages (as injected, maybe rewritten) too.
const RUNS2 = [
  { page: 3, data: Buffer.alloc(PSZ * 2, 0xab) },
  { page: 40, data: Buffer.alloc(PSZ, 0xbb) },
];

async function chain(s: Scratch) {
  const base = await baseSnapshot(s, "base", MEM);
  const b1 = await diffSnapshot(s, "b1", base, base, diffOf(RUNS1));
  const b2 = await diffSnapshot(s, "b2", b1, base, diffOf(RUNS2));
  return { base, b1, b2 };
}

test("format 3: memoryBase and files.memoryDiff go together; full images stay format 2", async () => {
  const s = await scratch();
  try {
    const { base, b1 } = await chain(s);
    assert.equal(base.format, SNAPSHOT_FORMAT);
    assert.equal(b1.format, SNAPSHOT_FORMAT_DIFF);
    assert.deepEqual((await readMeta(s.store.filesFor("b1").meta)).memoryBase, {
      tag: "base",
      checksum: base.files.memory.sha256,
    });
    const { checksum: _c, memoryBase: _m, ...noBase } = b1;
    await assert.rejects(writeMeta(join(s.root, "x.json"), noBase), /memoryBase/);
    // A reader that is handed a diff's fields under format 2 refuses it.
    const p = s.store.filesFor("b1").meta;
    const raw = JSON.parse(await readFile(p, "utf8")) as Record<string, unknown>;
    await writeFile(p, JSON.stringify({ ...raw, format: 2 }));
    await assert.rejects(
      readMeta(p),
      (e: unknown) => e instanceof ForkdError && e.code === "snapshot_corrupt",
    );
  } finally {
    await s.done();
  }
});

test("the store resolves a diff snapshot's memory to its base's image and verifies the base", async () => {
  const s = await scratch();
  try {
    await chain(s);
    const b2 = await s.store.get("b2");
    assert.equal(b2.files.memory, s.store.filesFor("base").memory, "children map the base image");
    assert.equal(b2.files.memoryDiff, memoryDiffFile(s.store.filesFor("b2").dir));
    const info = await s.store.info("b2");
    assert.equal(info.logical_bytes, MEM.length + (1 << 20));
    assert.ok(info.physical_bytes < MEM.length, `physical ${info.physical_bytes}: the diff, not the image`);
    // The base is kept while diffs need its image, even past its direct dependents.
    await assert.rejects(s.store.delete("base"), /b1.*b2|b2.*b1|b1/);
    // A diff recorded against another image of its base is refused, once the cache is cold.
    const fresh = new SnapshotStore(s.store.root);
    const f = fresh.filesFor("b2");
    const { checksum: _c, ...m } = await readMeta(f.meta);
    await writeMeta(f.meta, { ...m, memoryBase: { tag: "base", checksum: "c".repeat(64) } });
    await assert.rejects(fresh.get("b2"), /memory base base has changed/);
    // A diff that is missing is refused too.
    const other = new SnapshotStore(s.store.root);
    await rm(memoryDiffFile(s.store.filesFor("b1").dir));
    await assert.rejects(other.get("b1"));
  } finally {
    await s.done();
  }
});

test("applyMemoryDiff writes base + diff byte for byte and refuses runs outside the image", async () => {
  const s = await scratch();
  try {
    const base = join(s.root, "base.mem");
    await writeFile(base, MEM);
    await writeFile(join(s.root, "d"), diffOf(RUNS2));
    await applyMemoryDiff(base, join(s.root, "d"), join(s.root, "out"));
    assert.ok((await readFile(join(s.root, "out"))).equals(expected(MEM, RUNS2)));
    assert.equal((await stat(join(s.root, "out"))).mode & 0o777, 0o444);
    await writeFile(join(s.root, "bad"), diffOf([{ page: PAGES, data: Buffer.alloc(PSZ) }]));
    await assert.rejects(
      applyMemoryDiff(base, join(s.root, "bad"), join(s.root, "out2")),
      (e: unknown) => e instanceof ForkdError && e.code === "snapshot_corrupt",
    );
    await assert.rejects(stat(join(s.root, "out2")), "nothing half-made left");
  } finally {
    await s.done();
  }
});

test("compact of a diff snapshot is a base with a full image", async () => {
  const s = await scratch();
  try {
    await chain(s);
    const flat = await compactSnapshot(s.store, "b2", "b2-flat", tools);
    assert.equal(flat.memoryBase, undefined);
    assert.equal(flat.files.memoryDiff, undefined);
    assert.equal(flat.format, SNAPSHOT_FORMAT);
    const snap = await s.store.get("b2-flat");
    assert.equal(snap.files.memory, s.store.filesFor("b2-flat").memory);
    assert.ok((await readFile(snap.files.memory)).equals(expected(MEM, RUNS2)));
    assert.equal((await sha256File(snap.files.memory)).sha256, flat.files.memory.sha256);
  } finally {
    await s.done();
  }
});

test("a forced delete of a memory base gives every diff under it a full image first", async () => {
  const s = await scratch();
  try {
    await chain(s);
    const drained: string[] = [];
    const hooks = {
      inUse: () => 0,
      beforeDelete: (t: string) => Promise.resolve(void drained.push(t)),
      tools,
    };
    const r = await deleteSnapshot(s.store, "base", { cascade: false, force: true }, hooks);
    assert.deepEqual(r.orphaned, ["b1"]);
    assert.ok(drained.includes("b2"), "the pool of a snapshot whose memory is rewritten is drained");
    for (const [tag, runs] of [
      ["b1", RUNS1],
      ["b2", RUNS2],
    ] as const) {
      const snap = await new SnapshotStore(s.store.root).get(tag);
      assert.equal(snap.meta.memoryBase, undefined, tag);
      assert.equal(snap.files.memoryDiff, undefined);
      assert.ok((await readFile(snap.files.memory)).equals(expected(MEM, runs)), `${tag}: base + its diff`);
      await assert.rejects(stat(memoryDiffFile(snap.files.dir)), "its diff is gone");
    }
    // A diff whose base is in use (its children map the image) is not rewritten under them.
    const t = await scratch();
    try {
      await chain(t);
      await assert.rejects(
        deleteSnapshot(
          t.store,
          "b1",
          { cascade: false, force: true },
          {
            inUse: (tag) => (tag === "b2" ? 1 : 0),
            beforeDelete: () => Promise.resolve(),
            tools,
          },
        ),
        /b2 has 1 running/,
      );
    } finally {
      await t.done();
    }
  } finally {
    await s.done();
  }
});

test("cascade removes the diffs with their base", async () => {
  const s = await scratch();
  try {
    await chain(s);
    const r = await deleteSnapshot(
      s.store,
      "base",
      { cascade: true, force: false },
      { inUse: () => 0, beforeDelete: () => Promise.resolve(), tools },
    );
    assert.deepEqual(r.cascaded, ["b2", "b1"]);
    assert.deepEqual(await s.store.list(), []);
  } finally {
    await s.done();
  }
});

test("a pack of a diff branch carries its base's image and the diffs, and registers elsewhere", async () => {
  const s = await scratch();
  const t = await scratch();
  try {
    await chain(s);
    const dir = join(s.root, "pack");
    const manifest = await stagePack(s.store, "b2", dir);
    assert.deepEqual(manifest.chain, ["base", "b1", "b2"]);
    assert.ok("snapshots/base/memory" in manifest.files);
    assert.ok("snapshots/b2/memory.diff" in manifest.files);
    assert.ok(!("snapshots/b2/memory" in manifest.files), "no phantom full image");
    parsePackManifest(JSON.stringify(manifest));
    // Both, or a diff at the root, is not a pack.
    assert.throws(
      () =>
        parsePackManifest(
          JSON.stringify({
            ...manifest,
            files: { ...manifest.files, "snapshots/b2/memory": manifest.files["snapshots/base/memory"] },
          }),
        ),
      /exactly one of memory and memory.diff/,
    );
    // An unpack's files come from a tar, one link each; stagePack links the store's: copied, so
    // registering (which hands each disk layer to a jailed qemu-img) leaves the source's alone.
    for (const tag of manifest.chain) {
      const disk = join(dir, "snapshots", tag, "disk.qcow2");
      await copyFile(disk, `${disk}.copy`);
      await rename(`${disk}.copy`, disk);
    }
    const reg = await registerStaged(
      { store: t.store, cacheDir: join(t.root, "cache"), accel: "tcg", viewer: null, tools },
      dir,
      { as: "copy" },
    );
    assert.deepEqual(reg.published, ["base", "b1", "copy"]);
    const copy = await t.store.get("copy");
    assert.equal(copy.meta.memoryBase?.tag, "base");
    assert.equal(copy.files.memory, t.store.filesFor("base").memory);
    const full = join(t.root, "full");
    await applyMemoryDiff(copy.files.memory, copy.files.memoryDiff ?? "", full);
    assert.ok((await readFile(full)).equals(expected(MEM, RUNS2)));
  } finally {
    await s.done();
    await t.done();
  }
});

test("a pack whose diff snapshot names a memory base with another image is refused", async () => {
  const s = await scratch();
  const t = await scratch();
  try {
    await chain(s);
    const dir = join(s.root, "pack");
    await stagePack(s.store, "b1", dir);
    // A forger rewrites b1's meta (and the manifest's sum of it) to point at another image.
    const p = join(dir, "snapshots", "b1", "meta.json");
    const { checksum: _c, ...m } = await readMeta(p);
    await rm(p);
    await writeMeta(p, { ...m, memoryBase: { tag: "base", checksum: "d".repeat(64) } });
    const mf = JSON.parse(await readFile(join(dir, "manifest.json"), "utf8")) as {
      files: Record<string, unknown>;
    };
    mf.files["snapshots/b1/meta.json"] = await sha256File(p);
    await writeFile(join(dir, "manifest.json"), JSON.stringify(mf));
    await assert.rejects(
      registerStaged(
        { store: t.store, cacheDir: join(t.root, "cache"), accel: "tcg", viewer: null, tools },
        dir,
      ),
      /memory base base has another image/,
    );
    assert.deepEqual(await t.store.list(), [], "nothing registered");
  } finally {
    await s.done();
    await t.done();
  }
});
