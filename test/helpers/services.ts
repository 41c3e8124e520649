/** Services for API tests that never start a VM (QEMU is /bin/false). */
import { EventBus } from "../../src/events/bus.js";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import type { ServerType } from "@hono/node-server";
import { createApp } from "../../src/api/app.js";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AuthFailureLimiter } from "../../src/access/auth-failures.js";
import type { AuthFailureLimits } from "../../src/access/auth-failures.js";
import { DEFAULT_BUILD_CAPS } from "../../src/access/build-caps.js";
import { SandboxQuota } from "../../src/access/quota.js";
import { RateLimiter } from "../../src/access/rate-limit.js";
import type { RateLimits } from "../../src/access/rate-limit.js";
import { Authenticator, TokenStore } from "../../src/access/tokens.js";
import type { AuditRecord } from "../../src/audit/audit-log.js";
import { DEFAULT_BODY_LIMITS } from "../../src/app/body-limits.js";
import type { BodyLimits } from "../../src/app/body-limits.js";
import { NO_METRICS } from "../../src/app/services.js";
import type { ApiServices as Services, Listener } from "../../src/api/services.js";
import { ImageBuilder } from "../../src/image/builder.js";
import { SandboxService } from "../../src/sandbox/service.js";
import { SnapshotService } from "../../src/snapshot/service.js";
import { SnapshotStore } from "../../src/snapshot/store.js";
import { BlobCache } from "../../src/snapshot/blobs.js";
import { registrySettings } from "../../src/registry/settings.js";
import { QemuDriver } from "../../src/vmm/qemu.js";
import { JailedTools } from "../../src/vmm/jailed-tools.js";

export const quiet = { info: () => undefined, warn: () => undefined };

export interface TestServices {
  services: Services;
  dir: string;
  /** Audit records appended so far. */
  audited: AuditRecord[];
  /** A TCP-like listener: FORKD_TOKEN `adminToken` plus the tokens file in `dir`. */
  tcp: (adminToken?: string) => Listener;
  /** Serves the API on 127.0.0.1 (a free port) behind tcp(adminToken); its URL. Closed by cleanup(). */
  serveTcp: (adminToken: string) => Promise<string>;
  cleanup: () => Promise<void>;
}

export async function testServices(
  opts: { rate?: Partial<RateLimits>; body?: Partial<BodyLimits>; authFailures?: AuthFailureLimits } = {},
): Promise<TestServices> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-api-"));
  await mkdir(join(dir, "snapshots"));
  await mkdir(join(dir, "sandboxes"));
  const events = new EventBus();
  const store = new SnapshotStore(join(dir, "snapshots"), events);
  const driver = new QemuDriver("/bin/false");
  const accel = { accel: "tcg" as const, forced: true, reason: "test", tscKhz: 1 };
  const sandboxes = new SandboxService({ root: join(dir, "sandboxes"), store, driver, log: quiet, events });
  const tokens = new TokenStore(join(dir, "tokens.json"));
  const audited: AuditRecord[] = [];
  const snapshots = new SnapshotService({
    store,
    create: {
      store,
      driver,
      images: new ImageBuilder(dir, dir),
      accel,
      qemuVersion: "0",
      runDir: join(dir, "run"),
      tools: new JailedTools(null, null),
    },
    transfer: { store, blobs: new BlobCache(join(dir, "blobs")), registry: registrySettings({}) },
    cacheDir: dir,
    accel: accel.accel,
    sandboxes,
    log: quiet,
  });
  const services: Services = {
    events,
    store,
    sandboxes,
    snapshots,
    log: quiet,
    info: {
      version: "test",
      accel,
      qemu: { binary: "/bin/false", version: "0" },
      startedAt: "",
      cacheDir: dir,
      hostDirs: { data: dir },
    },
    tokens,
    limits: {
      body: { ...DEFAULT_BODY_LIMITS, ...opts.body },
      rate: new RateLimiter({ rps: 0, burst: 1, maxInflight: 0, maxHeavy: 0, ...opts.rate }),
      quota: new SandboxQuota(),
      buildCaps: DEFAULT_BUILD_CAPS,
      authFailures: new AuthFailureLimiter(opts.authFailures ?? { rps: 0, burst: 1 }),
    },
    metrics: NO_METRICS,
    audit: { append: (r) => audited.push(r) },
  };
  const servers: ServerType[] = [];
  const tcp = (adminToken?: string): Listener => ({ auth: new Authenticator(tokens, adminToken) });
  return {
    services,
    dir,
    audited,
    tcp,
    serveTcp: async (adminToken) => {
      const app = createApp(services, tcp(adminToken));
      const server = await new Promise<ServerType>((resolve) => {
        const s = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, () => resolve(s));
      });
      servers.push(server);
      return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    },
    cleanup: async () => {
      for (const s of servers) await new Promise((r) => s.close(r));
      await sandboxes.killAll();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
