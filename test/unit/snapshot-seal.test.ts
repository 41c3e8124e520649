/**
 * The snapshot seal (src/snapshot/seal.ts): the one way a staging directory becomes a snapshot.
 * Modes, sums (computed, or the caller's where given), the child layer, checksummed metadata,
 * publication by rename, the background-write marker removed; a failure before the rename
 * leaves no tag, and recovery removes the staging directory.
 */
import assert from "node:assert/strict";
import { mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { sha256File } from "../../src/snapshot/meta.js";
import type { SealMeta } from "../../src/snapshot/seal.js";
import { memoryDiffFile, snapshotFiles, SnapshotStore } from "../../src/snapshot/store.js";
import { fakeMeta } from "../helpers/snapshots.js";

async function withStore(fn: (store: SnapshotStore) => Promise<void>): Promise<void> {
  const root = await mkdtemp(join(tmpdir(), "forkd-seal-"));
  try {
    await fn(new SnapshotStore(root));
  } finally {
    await rm(root, { recursive: true, force: true });
  }
}

/** A staging directory holding a full snapshot's images. */
async function staged(store: SnapshotStore, suffix: string, diff = false): Promise<string> {
  const dir = await store.stage(suffix);
  const f = snapshotFiles(dir);
  await writeFile(diff ? memoryDiffFile(dir) : f.memory, Buffer.alloc(8192, 1));
  await writeFile(f.vmstate, "devices");
  await writeFile(f.disk, Buffer.alloc(512, 2));
  return dir;
}

function sealMeta(over: Partial<SealMeta> = {}): SealMeta {
  const { tag: _t, checksum: _c, files: _f, ...rest } = { ...fakeMeta("x", null, {} as never), checksum: "" };
  return { ...rest, files: {}, ...over };
}

const mode = async (p: string): Promise<number> => (await stat(p)).mode & 0o777;

test("seal: hashes, freezes modes, makes the child layer, writes verifiable metadata, publishes", async () => {
  await withStore(async (store) => {
    const staging = await staged(store, "a");
    await store.markWriting(staging, { tag: "a", started: new Date().toISOString(), source: null });
    const want = await sha256File(join(staging, "memory"));
    const meta = await store.seal(staging, "a", sealMeta());
    assert.equal(meta.tag, "a");
    assert.equal(meta.format, 2);
    assert.deepEqual(meta.files.memory, want);
    const f = store.filesFor("a");
    for (const p of [f.memory, f.vmstate, f.disk]) assert.equal(await mode(p), 0o444, p);
    assert.equal(await mode(f.childDisk), 0o644);
    // The staging directory is the snapshot now; its write marker is gone.
    assert.deepEqual((await readdir(store.root)).sort(), ["a"]);
    assert.deepEqual((await readdir(f.dir)).sort(), [
      "child.qcow2",
      "disk.qcow2",
      "memory",
      "meta.json",
      "vmstate",
    ]);
    // What the seal wrote is what get() verifies (checksum, device state, sizes).
    const got = await store.get("a");
    assert.equal(got.meta.checksum, meta.checksum);
  });
});

test("seal: a sum the caller gives is recorded as given (a shared or verified file is not re-read)", async () => {
  await withStore(async (store) => {
    const staging = await staged(store, "b");
    const known = { size: 8192, sha256: "e".repeat(64) };
    const meta = await store.seal(staging, "b", sealMeta({ files: { memory: known } }));
    assert.deepEqual(meta.files.memory, known);
    assert.deepEqual(meta.files.vmstate, await sha256File(store.filesFor("b").vmstate));
  });
});

test("seal: a diff snapshot records its base's image and its own diff (format 3)", async () => {
  await withStore(async (store) => {
    const staging = await staged(store, "d", true);
    const base = { size: 8192, sha256: "a".repeat(64) };
    await assert.rejects(
      store.seal(staging, "d", sealMeta({ memoryBase: { tag: "base", checksum: base.sha256 } })),
      /base image's sum/,
    );
    const meta = await store.seal(
      staging,
      "d",
      sealMeta({ memoryBase: { tag: "base", checksum: base.sha256 }, files: { memory: base } }),
    );
    assert.equal(meta.format, 3);
    assert.deepEqual(meta.files.memory, base);
    assert.deepEqual(meta.files.memoryDiff, await sha256File(memoryDiffFile(store.filesFor("d").dir)));
    assert.equal(await mode(memoryDiffFile(store.filesFor("d").dir)), 0o444);
  });
});

test("seal: a failure before the rename publishes nothing; recovery removes the staging directory", async () => {
  await withStore(async (store) => {
    const staging = await staged(store, "c");
    await store.markWriting(staging, { tag: "c", started: new Date().toISOString(), source: null });
    await assert.rejects(
      store.seal(staging, "c", sealMeta(), {
        beforePublish: () => {
          throw new Error("killed here");
        },
      }),
      /killed here/,
    );
    assert.equal(await store.has("c"), false);
    const removed = await store.recover();
    assert.equal(removed.length, 1);
    assert.equal(await store.has("c"), false);
    assert.equal((await store.pending("c"))?.status, "failed");
  });
});

test("seal: an existing tag is a conflict, and the staging directory is left to its caller", async () => {
  await withStore(async (store) => {
    await store.seal(await staged(store, "e1"), "e", sealMeta());
    const again = await staged(store, "e2");
    await assert.rejects(store.seal(again, "e", sealMeta()), /already exists/);
    assert.ok((await readdir(store.root)).includes(".staging-e2"));
  });
});
