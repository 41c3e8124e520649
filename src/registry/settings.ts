/**
 * The daemon's registry settings, read once from its environment by the entry point:
 *
 *   FORKD_INSECURE_REGISTRIES   comma-separated hosts (host or host:port) spoken to over http
 *   FORKD_REGISTRY_CHUNK_MIB    blobs above this go up in PATCH chunks of this size (256)
 *   FORKD_REGISTRY_IDLE_S       a registry request making no progress this long fails (120)
 *   FORKD_TENANT_REGISTRIES     comma-separated hosts (host or host:port) tenants may pull from
 *                               whatever their addresses (reach.ts)
 *   FORKD_REGISTRY_USER, FORKD_REGISTRY_PASSWORD, FORKD_REGISTRY_HOSTS: credentials.ts
 */
import { credentialsFromEnv } from "./credentials.js";
import type { RegistrySettings } from "./client.js";
import { TENANT_REGISTRIES_ENV, parseAllowedHosts, tenantGuard } from "./reach.js";

const positive = (v: string | undefined, dflt: number): number => {
  const n = Number(v);
  return Number.isFinite(n) && n > 0 ? n : dflt;
};

export function registrySettings(env: NodeJS.ProcessEnv): RegistrySettings {
  return {
    credentials: credentialsFromEnv(env),
    insecureHosts: (env.FORKD_INSECURE_REGISTRIES ?? "")
      .split(",")
      .map((h) => h.trim().toLowerCase())
      .filter((h) => h.length > 0),
    chunkBytes: Math.round(positive(env.FORKD_REGISTRY_CHUNK_MIB, 256) * 2 ** 20),
    idleMs: positive(env.FORKD_REGISTRY_IDLE_S, 120) * 1000,
    tenant: tenantGuard(parseAllowedHosts(env[TENANT_REGISTRIES_ENV] ?? "")),
  };
}
