/**
 * A creation its client waits on (POST /v1/snapshots, a Dockerfile build) is listed and told as
 * `writing` while it runs (SnapshotStore.announce): ready when published, gone when it ends with
 * nothing, failed when its failure is recorded; a tag that is published or already being made is
 * never shown writing by a second creation, which fails with a conflict.
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { EventBus } from "../../src/events/bus.js";
import type { CoreEvent } from "../../src/events/bus.js";
import { SnapshotStore } from "../../src/snapshot/store.js";
import { fakeSnapshot } from "../helpers/snapshots.js";

let dir: string;
let store: SnapshotStore;
const told: string[] = [];

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "forkd-announce-"));
  const bus = new EventBus();
  bus.subscribe((e: CoreEvent) => {
    if (e.type === "snapshot" || e.type === "snapshot-gone") told.push(`${e.type}:${e.tag}`);
  });
  await mkdir(join(dir, "snapshots"));
  store = new SnapshotStore(join(dir, "snapshots"), bus);
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

const started = new Date().toISOString();
const statusOf = async (tag: string) => (await store.pending(tag))?.status ?? "none";
const listed = async () => (await store.listPending()).map((p) => `${p.tag}:${p.status}`);

test("a creation reads writing while it runs, and nothing once it ended with nothing", async () => {
  told.length = 0;
  const end = await store.announce({ tag: "a", started, source: null, owner: "alice" });
  assert.equal(await statusOf("a"), "writing");
  assert.deepEqual(await listed(), ["a:writing"]);
  assert.equal((await store.pending("a"))?.owner, "alice");
  end(false);
  assert.equal(await statusOf("a"), "none");
  assert.deepEqual(await listed(), []);
  assert.deepEqual(told, ["snapshot:a", "snapshot:a"], "told when it starts and when it ends");
  end(false);
  assert.equal(told.length, 2, "a second end changes nothing");
});

test("a failure recorded reads failed; made again it reads writing until that ends", async () => {
  const end = await store.announce({ tag: "f", started, source: null, owner: null });
  await store.recordFailed({ tag: "f", started, source: null, owner: null }, new Error("boom"));
  end(false);
  assert.equal(await statusOf("f"), "failed");
  const again = await store.announce({ tag: "f", started, source: null, owner: null });
  assert.equal(await statusOf("f"), "writing");
  assert.deepEqual(await listed(), ["f:writing"]);
  again(false);
  assert.equal(await statusOf("f"), "failed");
  assert.deepEqual(await listed(), ["f:failed"]);
});

test("a published tag, or one already being made, is not announced again", async () => {
  await fakeSnapshot(store, "ready", null);
  told.length = 0;
  const none = await store.announce({ tag: "ready", started, source: null, owner: null });
  assert.equal(await statusOf("ready"), "none");
  assert.deepEqual(told, []);
  none(false);
  assert.deepEqual(told, []);

  const first = await store.announce({ tag: "b", started, source: null, owner: "alice" });
  const second = await store.announce({ tag: "b", started, source: null, owner: "bob" });
  second(false);
  assert.equal((await store.pending("b"))?.owner, "alice", "the second creation did not hide the first");
  first(false);
  assert.equal(await statusOf("b"), "none");
});

test("a creation published is listed ready, not also writing", async () => {
  const end = await store.announce({ tag: "p", started, source: null, owner: null });
  await fakeSnapshot(store, "p", null);
  assert.ok(!(await listed()).includes("p:writing"));
  end(true);
  assert.ok(await store.has("p"));
});
