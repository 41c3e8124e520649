/**
 * What the application layer (and through it every front door) is given: the services it calls,
 * the caller's limits, the metrics and the audit log. Built by the daemon's entry point; a front
 * door adds only what is its own (the REST API's console: src/api/services.ts; E2B's keys and
 * access tokens: src/e2b/context.ts).
 */
import type { AuthFailureLimiter } from "../access/index.js";
import type { BuildCaps } from "../access/index.js";
import type { SandboxQuota } from "../access/index.js";
import type { RateLimiter } from "../access/index.js";
import type { TokenStore } from "../access/index.js";
import type { AuditRecord } from "../audit/index.js";
import type { EventBus } from "../events/index.js";
import type { AccelChoice } from "../vmm/index.js";
import type { SandboxService } from "../sandbox/index.js";
import type { SnapshotService } from "../snapshot/index.js";
import type { SnapshotStore } from "../snapshot/index.js";
import type { Logger } from "../util/index.js";
import type { WebhookService } from "../webhooks/index.js";
import type { BodyLimits } from "./body-limits.js";

/** Latencies and failures recorded by the front doors' edges and the use cases (src/metrics/metrics.ts). */
export interface AppMetrics {
  http(route: string, method: string, code: number, seconds: number): void;
  /** One forked child, until its agent answered. */
  fork(seconds: number): void;
  branchPause(seconds: number): void;
  exec(seconds: number): void;
  failure(op: string, reason: string): void;
  /** The Prometheus text exposition. */
  render(): Promise<{ contentType: string; text: string }>;
}

export const NO_METRICS: AppMetrics = {
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
  /** Everything done with snapshots: create, pack, push, pull, delete, ... */
  snapshots: SnapshotService;
  log: Logger;
  info: {
    version: string;
    accel: AccelChoice;
    qemu: { binary: string; version: string };
    startedAt: string;
    /** The cluster node this daemon is (FORKD_NODE_ID; null or absent: it runs alone). */
    node?: string | null;
    /** Guest images: built in <cacheDir>/images, from packs in <cacheDir>/imported (image/content.ts). */
    cacheDir: string;
    /** The data, cache and repository directories by logical name (kept from tenants' errors). */
    hostDirs: Record<string, string>;
    /** Where E2B's API answers, once its listener listens (absent: not served). */
    e2b?: { url: string; domain: string | null };
  };
  /** The tokens file (token management; what a credential opened, ended when it is revoked). */
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
  metrics: AppMetrics;
  /** The audit log (`path`: its file, read back by GET /v1/audit; absent: nothing to read). */
  audit: { append(r: AuditRecord): void; readonly path?: string };
  /** Changes of sandboxes and snapshots as they happen (GET /v1/events; src/events/bus.ts). */
  events: EventBus;
  /** Lifecycle webhooks (src/webhooks; absent: not served, e.g. a test's services). */
  webhooks?: WebhookService;
  /** A node of a cluster: tenants' quotas hold across it (absent: the daemon runs alone). */
  cluster?: ClusterAdmission;
}

/**
 * A tenant's quota across the cluster, as a node applies it (src/cluster/quota.ts): a fork a
 * gateway sent with its X-Forkd-Admitted header (`admits`) was reserved by the gateway; any
 * other fork of a tenant with a limit is reserved here, held until its children are recorded.
 */
export interface ClusterAdmission {
  /** Whether the X-Forkd-Admitted header's value is the cluster's (constant time). */
  admits(header: string | undefined): boolean;
  /** Reserves `n` sandboxes for `tenant` under `max` across the cluster (429 past it). */
  reserve(tenant: string, max: number, n: number): Promise<{ release(): Promise<void> }>;
}
