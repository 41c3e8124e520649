/**
 * The snapshot service's own duties beyond the store (no VM): a snapshot in use is never
 * deleted, a deleted one's warm pool is drained first (each tag of a cascade), a creation is
 * refused before any work when its tag is taken or its template unknown.
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { ImageBuilder } from "../../src/image/builder.js";
import { registrySettings } from "../../src/registry/settings.js";
import { BlobCache } from "../../src/snapshot/blobs.js";
import { SnapshotService } from "../../src/snapshot/service.js";
import { SnapshotStore } from "../../src/snapshot/store.js";
import { ForkdError } from "../../src/util/errors.js";
import { QemuDriver } from "../../src/vmm/qemu.js";
import { JailedTools } from "../../src/vmm/jailed-tools.js";
import { fakeSnapshot } from "../helpers/snapshots.js";
import { quiet } from "../helpers/services.js";

let dir = "";
let store: SnapshotStore;
const users = new Map<string, number>();
const events: string[] = [];
let svc: SnapshotService;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "forkd-snapsvc-"));
  store = new SnapshotStore(join(dir, "snapshots"));
  await mkdir(join(dir, "guest/image/templates"), { recursive: true });
  await writeFile(join(dir, "guest/image/templates/basic.packages"), "");
  const accel = { accel: "tcg" as const, forced: true, reason: "test", tscKhz: 1 };
  svc = new SnapshotService({
    store,
    create: {
      store,
      driver: new QemuDriver("/bin/false"),
      images: new ImageBuilder(dir, dir),
      accel,
      qemuVersion: "0",
      runDir: join(dir, "run"),
      tools: new JailedTools(null, null),
    },
    transfer: { store, blobs: new BlobCache(join(dir, "blobs")), registry: registrySettings({}) },
    cacheDir: dir,
    accel: "tcg",
    sandboxes: {
      prewarm: (tag) => events.push(`prewarm ${tag}`),
      countByTag: (tag) => users.get(tag) ?? 0,
      forgetSnapshot: async (tag) => {
        events.push(`forget ${tag} (present: ${await store.has(tag)})`);
      },
    },
    log: quiet,
  });
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

const code = (c: string) => (e: unknown) => e instanceof ForkdError && e.code === c;

test("a snapshot sandboxes use is not deleted, and its pool is left alone", async () => {
  await fakeSnapshot(store, "busy", null);
  users.set("busy", 2);
  events.length = 0;
  await assert.rejects(svc.delete("busy", { cascade: false, force: false }), code("conflict"));
  assert.deepEqual(events, []);
  assert.equal(await svc.has("busy"), true);
});

test("deleting drains the warm pool of the tag before it goes", async () => {
  await fakeSnapshot(store, "idle", null);
  events.length = 0;
  const r = await svc.delete("idle", { cascade: false, force: false });
  assert.deepEqual(r, {});
  assert.deepEqual(events, ["forget idle (present: true)"]);
  assert.equal(await svc.has("idle"), false);
  const { snapshots } = await svc.list();
  assert.deepEqual(
    snapshots.map((m) => m.tag),
    ["busy"],
  );
});

test("a creation with a taken tag or an unknown template is refused before any work", async () => {
  await assert.rejects(svc.checkCreatable("busy", { template: "basic" }), code("conflict"));
  await svc.checkCreatable("new", { template: "basic" });
  await assert.rejects(svc.checkCreatable("new", { template: "no-such-template" }), code("invalid_argument"));
  await assert.rejects(
    svc.create({ tag: "new", from: { template: "no-such-template" }, memoryMiB: 256, vcpus: 1 }),
    code("invalid_argument"),
  );
  // Without an image puller, a snapshot from an image is refused at once, naming why.
  await assert.rejects(svc.checkCreatable("new", { image: "busybox:latest" }), code("unavailable"));
  await assert.rejects(
    svc.create({ tag: "new", from: { image: "busybox:latest" }, memoryMiB: 256, vcpus: 1 }),
    code("unavailable"),
  );
  // A taken tag is refused before any image is pulled or built.
  await assert.rejects(
    svc.create({ tag: "busy", from: { image: "busybox:latest" }, memoryMiB: 256, vcpus: 1 }),
    code("conflict"),
  );
  assert.equal(events.includes("prewarm new"), false);
});
