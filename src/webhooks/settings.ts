/**
 * The operator's webhook settings, from the environment: FORKD_WEBHOOK_TIMEOUT_MS (one attempt's
 * deadline, default 10 s), FORKD_WEBHOOK_CONCURRENCY (attempts under way at once, all webhooks,
 * default 8), FORKD_WEBHOOK_MAX_QUEUE (undelivered events kept per webhook, default 1000),
 * FORKD_WEBHOOK_MAX_ATTEMPTS (default 15) and FORKD_WEBHOOK_RETRY_BASE_MS (default 1 s: the
 * first retry's wait, doubled each time up to 10 min), FORKD_WEBHOOK_MAX_PER_TENANT (default 16),
 * FORKD_TENANT_WEBHOOK_HOSTS (hosts a tenant's webhook may post to whatever their address, as
 * FORKD_TENANT_REGISTRIES for registries; otherwise only public addresses).
 */
import { parseAllowedHosts } from "../registry/index.js";
import type { AllowedHost } from "../registry/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { DEFAULT_RETRY } from "./backoff.js";
import type { RetryPolicy } from "./backoff.js";

export interface WebhookSettings {
  timeoutMs: number;
  concurrency: number;
  maxQueue: number;
  retry: RetryPolicy;
  maxPerTenant: number;
  allowedHosts: AllowedHost[];
}

export const DEFAULT_WEBHOOK_SETTINGS: WebhookSettings = {
  timeoutMs: 10_000,
  concurrency: 8,
  maxQueue: 1000,
  retry: DEFAULT_RETRY,
  maxPerTenant: 16,
  allowedHosts: [],
};

export const TENANT_WEBHOOK_HOSTS_ENV = "FORKD_TENANT_WEBHOOK_HOSTS";

function int(env: NodeJS.ProcessEnv, name: string, dflt: number, min: number, max: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return dflt;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min || n > max)
    throw new ForkdError(
      "invalid_argument",
      `${name}: ${JSON.stringify(raw)} is not an integer in [${min}, ${max}]`,
    );
  return n;
}

export function webhookSettings(env: NodeJS.ProcessEnv): WebhookSettings {
  let allowedHosts: AllowedHost[] = [];
  try {
    allowedHosts = parseAllowedHosts(env[TENANT_WEBHOOK_HOSTS_ENV] ?? "");
  } catch (e) {
    throw new ForkdError("invalid_argument", `${TENANT_WEBHOOK_HOSTS_ENV}: ${errorMessage(e)}`);
  }
  return {
    timeoutMs: int(env, "FORKD_WEBHOOK_TIMEOUT_MS", DEFAULT_WEBHOOK_SETTINGS.timeoutMs, 100, 600_000),
    concurrency: int(env, "FORKD_WEBHOOK_CONCURRENCY", DEFAULT_WEBHOOK_SETTINGS.concurrency, 1, 1024),
    maxQueue: int(env, "FORKD_WEBHOOK_MAX_QUEUE", DEFAULT_WEBHOOK_SETTINGS.maxQueue, 1, 1_000_000),
    retry: {
      ...DEFAULT_RETRY,
      baseMs: int(env, "FORKD_WEBHOOK_RETRY_BASE_MS", DEFAULT_RETRY.baseMs, 10, 600_000),
      maxAttempts: int(env, "FORKD_WEBHOOK_MAX_ATTEMPTS", DEFAULT_RETRY.maxAttempts, 1, 100),
    },
    maxPerTenant: int(env, "FORKD_WEBHOOK_MAX_PER_TENANT", DEFAULT_WEBHOOK_SETTINGS.maxPerTenant, 0, 10_000),
    allowedHosts,
  };
}
