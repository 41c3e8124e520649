/** What the API layer is given: the services it calls. Built by the daemon's entry point. */
import type { AuthFailureLimiter } from "../access/auth-failures.js";
import type { BuildCaps } from "../access/build-caps.js";
import type { SandboxQuota } from "../access/quota.js";
import type { RateLimiter } from "../access/rate-limit.js";
import type { Authenticator, TokenStore } from "../access/tokens.js";
import type { AuditRecord } from "../audit/audit-log.js";
import type { AccelChoice } from "../vmm/accel.js";
import type { SnapshotService } from "../snapshot/service.js";
import type { SnapshotStore } from "../snapshot/store.js";
import type { Logger } from "../util/log.js";
import type { SandboxService } from "../sandbox/service.js";
import type { E2bContext } from "../e2b/context.js";
import type { EventBus } from "../events/bus.js";
import type { ConsoleSessions } from "../console/sessions.js";

/** Bounds on request bodies, in bytes (see docs/operations.md, "Limits"). */
export interface BodyLimits {
  /** Ordinary JSON bodies. */
  json: number;
  /** JSON bodies that carry code or stdin: exec, eval, snapshot creation. */
  code: number;
  /** Raw stdin written to a running command. */
  stdin: number;
  /** A file upload (streamed). */
  upload: number;
  /** A snapshot pack (streamed). */
  pack: number;
}

export const DEFAULT_BODY_LIMITS: BodyLimits = {
  json: 1 << 20,
  code: 20 << 20,
  stdin: 16 << 20,
  upload: 8 * 2 ** 30,
  pack: 64 * 2 ** 30,
};

/** Latencies and failures the API layer records (implemented by src/metrics/metrics.ts). */
export interface ApiMetrics {
  http(route: string, method: string, code: number, seconds: number): void;
  /** One forked child, until its agent answered. */
  fork(seconds: number): void;
  branchPause(seconds: number): void;
  exec(seconds: number): void;
  failure(op: string, reason: string): void;
  /** The Prometheus text exposition. */
  render(): Promise<{ contentType: string; text: string }>;
}

export const NO_METRICS: ApiMetrics = {
  http: () => undefined,
  fork: () => undefined,
  branchPause: () => undefined,
  exec: () => undefined,
  failure: () => undefined,
  render: async () => ({ contentType: "text/plain; version=0.0.4; charset=utf-8", text: "" }),
};

export interface Services {
  /** The snapshot store itself (tests seed it; routes go through `snapshots`). */
  store: SnapshotStore;
  sandboxes: SandboxService;
  /** Everything the API does with snapshots: create, pack, push, pull, delete, ... */
  snapshots: SnapshotService;
  log: Logger;
  info: {
    version: string;
    accel: AccelChoice;
    qemu: { binary: string; version: string };
    startedAt: string;
    /** Guest images: built in <cacheDir>/images, from packs in <cacheDir>/imported (image/content.ts). */
    cacheDir: string;
    /** The data, cache and repository directories by logical name (kept from tenants' errors). */
    hostDirs: Record<string, string>;
    /** Where E2B's API answers, once its listener listens (absent: not served). */
    e2b?: { url: string; domain: string | null };
  };
  /** The tokens file (token management routes). */
  tokens: TokenStore;
  limits: {
    body: BodyLimits;
    rate: RateLimiter;
    quota: SandboxQuota;
    /** The operator's caps on what is built for a tenant (a token may carry its own). */
    buildCaps: BuildCaps;
    /** Failed authentication per remote address (TCP listeners). */
    authFailures: AuthFailureLimiter;
  };
  metrics: ApiMetrics;
  /** The audit log (`path`: its file, read back by GET /v1/audit; absent: nothing to read). */
  audit: { append(r: AuditRecord): void; readonly path?: string };
  /** Changes of sandboxes and snapshots as they happen (GET /v1/events; src/events/bus.ts). */
  events: EventBus;
  /** The web console: its built front end and sessions (src/console; absent: not served). */
  console?: { dist: string; sessions: ConsoleSessions };
  /** E2B's API (src/e2b), when the daemon serves it (FORKD_E2B_LISTEN). */
  e2b?: E2bContext;
}

/** What differs between listeners: the unix socket serves the local admin, TCP needs tokens. */
export interface Listener {
  /** null: every caller is `local` (the unix socket); else a bearer token is required. */
  auth: Authenticator | null;
}
