/** What the API layer is given: the services it calls. Built by the daemon's entry point. */
import type { AccelChoice } from "../host/accel.js";
import type { SnapshotDeps } from "../snapshot/create.js";
import type { SnapshotStore } from "../snapshot/store.js";
import type { TransferDeps } from "../snapshot/push.js";
import type { Logger, SandboxService } from "../sandbox/service.js";

export interface Services {
  store: SnapshotStore;
  sandboxes: SandboxService;
  snapshotDeps: SnapshotDeps;
  /** Push and pull: the store, the blob digest cache and the registry settings. */
  transfer: TransferDeps;
  log: Logger;
  info: {
    version: string;
    accel: AccelChoice;
    qemu: { binary: string; version: string };
    startedAt: string;
    /** Guest images live in <cacheDir>/images (unpack installs packed ones there). */
    cacheDir: string;
  };
  /** Bearer token required on every request except /v1/health (TCP listeners). */
  token?: string;
}
