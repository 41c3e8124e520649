/** Services for API tests that never start a VM (QEMU is /bin/false). */
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Services } from "../../src/api/services.js";
import { ImageBuilder } from "../../src/image/builder.js";
import { SandboxService } from "../../src/sandbox/service.js";
import { SnapshotStore } from "../../src/snapshot/store.js";
import { BlobCache } from "../../src/snapshot/blobs.js";
import { registrySettings } from "../../src/registry/settings.js";
import { QemuDriver } from "../../src/vmm/qemu.js";

export const quiet = { info: () => undefined, warn: () => undefined };

export async function testServices(
  opts: { token?: string } = {},
): Promise<{ services: Services; dir: string; cleanup: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-api-"));
  await mkdir(join(dir, "snapshots"));
  await mkdir(join(dir, "sandboxes"));
  const store = new SnapshotStore(join(dir, "snapshots"));
  const driver = new QemuDriver("/bin/false");
  const accel = { accel: "tcg" as const, forced: true, reason: "test", tscKhz: 1 };
  const sandboxes = new SandboxService({ root: join(dir, "sandboxes"), store, driver, log: quiet });
  const services: Services = {
    store,
    sandboxes,
    log: quiet,
    token: opts.token,
    transfer: { store, blobs: new BlobCache(join(dir, "blobs")), registry: registrySettings({}) },
    snapshotDeps: {
      store,
      driver,
      images: new ImageBuilder(dir, dir),
      accel,
      qemuVersion: "0",
      runDir: join(dir, "run"),
    },
    info: {
      version: "test",
      accel,
      qemu: { binary: "/bin/false", version: "0" },
      startedAt: "",
      cacheDir: dir,
    },
  };
  return {
    services,
    dir,
    cleanup: async () => {
      await sandboxes.killAll();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
