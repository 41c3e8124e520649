/** TCP listeners require the bearer token on everything but /v1/health. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createApp } from "../../src/api/app.js";
import { SnapshotStore } from "../../src/snapshot/store.js";
import { SandboxService } from "../../src/sandbox/service.js";
import { QemuDriver } from "../../src/vmm/qemu.js";
import { ImageBuilder } from "../../src/image/builder.js";
import { BlobCache } from "../../src/snapshot/blobs.js";
import { registrySettings } from "../../src/registry/settings.js";

const TOKEN = "t".repeat(20) + "0123456789abcdef";

test("bearer token: missing or wrong is 401 with the envelope, right is served, health is open", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-auth-"));
  const quiet = { info: () => undefined, warn: () => undefined };
  const store = new SnapshotStore(join(dir, "snapshots"));
  const driver = new QemuDriver("/bin/false");
  const accel = { accel: "tcg" as const, forced: true, reason: "test", tscKhz: 1 };
  const app = createApp({
    store,
    sandboxes: new SandboxService({ root: join(dir, "sandboxes"), store, driver, log: quiet }),
    log: quiet,
    transfer: { store, blobs: new BlobCache(join(dir, "blobs")), registry: registrySettings({}) },
    snapshotDeps: { store, driver, images: new ImageBuilder(dir, dir), accel, qemuVersion: "0", runDir: dir },
    info: {
      version: "test",
      accel,
      qemu: { binary: "/bin/false", version: "0" },
      startedAt: "",
      cacheDir: dir,
    },
    token: TOKEN,
  });
  const get = (path: string, auth?: string) =>
    app.request(path, { headers: auth === undefined ? {} : { authorization: auth } });
  assert.equal((await get("/v1/health")).status, 200);
  for (const auth of [
    undefined,
    "",
    "Bearer",
    `Bearer ${TOKEN}x`,
    `Bearer ${TOKEN.slice(1)}`,
    TOKEN,
    `Basic ${TOKEN}`,
  ]) {
    const res = await get("/v1/sandboxes", auth);
    assert.equal(res.status, 401, String(auth));
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, "unauthenticated");
  }
  assert.equal((await get("/v1/sandboxes", `Bearer ${TOKEN}`)).status, 200);
});
