/**
 * The daemon's access settings, read once from the environment and checked before anything
 * listens: the TCP listener (FORKD_LISTEN, with tokens, optionally TLS), E2B's API listener
 * (FORKD_E2B_LISTEN, the same tokens and TLS), request limits, tenants' build caps and the audit log. Every number is
 * validated; a bad setting stops the daemon with a clear message.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { isIP } from "node:net";
import type { AuthFailureLimits } from "../access/index.js";
import { DEFAULT_BUILD_CAPS } from "../access/index.js";
import type { BuildCaps } from "../access/index.js";
import type { RateLimits } from "../access/index.js";
import { weakTokenReason } from "../access/index.js";
import { DEFAULT_BODY_LIMITS } from "../app/index.js";
import type { BodyLimits } from "../app/index.js";
import { ForkdError } from "../util/index.js";
import { DEFAULT_LIMITS } from "../util/index.js";
import type { ListenerLimits } from "../util/index.js";

export interface TcpConfig {
  host: string;
  port: number;
  loopback: boolean;
  tls: { cert: Buffer; key: Buffer } | null;
  maxConnections: number;
}

/** FORKD_E2B_LISTEN: where E2B's API (both its planes, src/e2b/server.ts) is served. */
export interface E2bListenConfig extends TcpConfig {
  /**
   * FORKD_E2B_DOMAIN: the domain replies name (E2B's `domain`), under which `<port>-<id>.<domain>`
   * reaches a sandbox; null: none (clients use E2B_SANDBOX_URL).
   */
  domain: string | null;
}

export interface AccessConfig {
  tcp: TcpConfig | null;
  e2b: E2bListenConfig | null;
  /** FORKD_TOKEN: an admin token (checked for strength). */
  adminToken: string | undefined;
  tokensFile: string;
  body: BodyLimits;
  rate: RateLimits;
  /** Failed authentication per remote address (TCP). */
  authFailures: AuthFailureLimits;
  /** Tenants' caps on what is built for them (a token may carry its own). */
  buildCaps: BuildCaps;
  audit: { dir: string; maxBytes: number; keep: number };
  /** Every listener's connection bounds and timeouts (src/util/listener-guard.ts). */
  listeners: ListenerLimits;
}

export function int(env: NodeJS.ProcessEnv, name: string, def: number, min = 0): number {
  const v = env[name];
  if (v === undefined || v === "") return def;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < min)
    throw new ForkdError(
      "invalid_argument",
      `${name} must be an integer >= ${min}, not ${JSON.stringify(v)}`,
    );
  return n;
}

export function isLoopback(host: string): boolean {
  if (host === "localhost") return true;
  if (isIP(host) === 4) return host.startsWith("127.");
  return host === "::1";
}

export async function readAccessConfig(env: NodeJS.ProcessEnv, dataDir: string): Promise<AccessConfig> {
  const adminToken = env.FORKD_TOKEN || undefined;
  if (adminToken !== undefined) {
    const weak = weakTokenReason(adminToken);
    if (weak) throw new ForkdError("invalid_argument", `FORKD_TOKEN is refused: ${weak}`);
  }
  const certPath = env.FORKD_TLS_CERT;
  const keyPath = env.FORKD_TLS_KEY;
  if (!certPath !== !keyPath)
    throw new ForkdError("invalid_argument", "FORKD_TLS_CERT and FORKD_TLS_KEY go together");
  if (certPath && !env.FORKD_LISTEN && !env.FORKD_E2B_LISTEN)
    throw new ForkdError(
      "invalid_argument",
      "FORKD_TLS_CERT/FORKD_TLS_KEY need FORKD_LISTEN or FORKD_E2B_LISTEN",
    );
  const read = async (p: string, what: string) =>
    readFile(p).catch((e: unknown) => {
      throw new ForkdError("invalid_argument", `cannot read ${what} ${p}: ${String(e)}`);
    });
  const tls =
    certPath && keyPath
      ? { cert: await read(certPath, "FORKD_TLS_CERT"), key: await read(keyPath, "FORKD_TLS_KEY") }
      : null;
  const maxConnections = int(env, "FORKD_MAX_CONNECTIONS", 1024, 1);
  const listener = (name: string, v: string): TcpConfig => {
    const a = parseListen(name, v);
    return { ...a, loopback: isLoopback(a.host), tls, maxConnections };
  };
  const tcp = env.FORKD_LISTEN ? listener("FORKD_LISTEN", env.FORKD_LISTEN) : null;
  let e2b: E2bListenConfig | null = null;
  if (env.FORKD_E2B_LISTEN) {
    const l = listener("FORKD_E2B_LISTEN", env.FORKD_E2B_LISTEN);
    if (tcp && tcp.port !== 0 && tcp.port === l.port && tcp.host === l.host)
      throw new ForkdError("invalid_argument", "FORKD_E2B_LISTEN and FORKD_LISTEN must differ");
    e2b = { ...l, domain: e2bDomain(env.FORKD_E2B_DOMAIN) };
  } else if (env.FORKD_E2B_DOMAIN) {
    throw new ForkdError("invalid_argument", "FORKD_E2B_DOMAIN needs FORKD_E2B_LISTEN");
  }
  const d = DEFAULT_BODY_LIMITS;
  return {
    tcp,
    e2b,
    adminToken,
    listeners: {
      maxConnections,
      perAddress: int(env, "FORKD_CONNECTIONS_PER_ADDRESS", DEFAULT_LIMITS.perAddress, 1),
      headersTimeoutMs: int(env, "FORKD_HEADERS_TIMEOUT_MS", DEFAULT_LIMITS.headersTimeoutMs, 100),
      keepAliveTimeoutMs: int(env, "FORKD_KEEPALIVE_TIMEOUT_MS", DEFAULT_LIMITS.keepAliveTimeoutMs, 100),
    },
    tokensFile: env.FORKD_TOKENS_FILE || join(dataDir, "tokens.json"),
    body: {
      json: int(env, "FORKD_MAX_JSON_BYTES", d.json, 1024),
      code: int(env, "FORKD_MAX_CODE_BYTES", d.code, 1024),
      stdin: int(env, "FORKD_MAX_STDIN_BYTES", d.stdin, 1),
      upload: int(env, "FORKD_MAX_UPLOAD_BYTES", d.upload, 1),
      pack: int(env, "FORKD_MAX_PACK_BYTES", d.pack, 1),
    },
    rate: {
      rps: int(env, "FORKD_RATE_RPS", 50),
      burst: int(env, "FORKD_RATE_BURST", 100, 1),
      maxInflight: int(env, "FORKD_MAX_INFLIGHT", 64),
      maxHeavy: int(env, "FORKD_MAX_HEAVY", 8),
    },
    authFailures: {
      rps: int(env, "FORKD_AUTH_FAIL_RPS", 1),
      burst: int(env, "FORKD_AUTH_FAIL_BURST", 20, 1),
    },
    buildCaps: {
      memoryMiB: int(env, "FORKD_TENANT_MAX_MEMORY_MIB", DEFAULT_BUILD_CAPS.memoryMiB, 128),
      vcpus: int(env, "FORKD_TENANT_MAX_VCPUS", DEFAULT_BUILD_CAPS.vcpus, 1),
      buildDiskMiB: int(env, "FORKD_TENANT_MAX_BUILD_DISK_MIB", DEFAULT_BUILD_CAPS.buildDiskMiB, 1),
    },
    audit: {
      dir: env.FORKD_AUDIT_DIR || join(dataDir, "audit"),
      maxBytes: int(env, "FORKD_AUDIT_MAX_BYTES", 64 << 20, 4096),
      keep: int(env, "FORKD_AUDIT_KEEP", 8, 1),
    },
  };
}

/** HOST:PORT (IPv6: [ADDR]:PORT) of a listener setting. */
export function parseListen(name: string, v: string): { host: string; port: number } {
  const m = /^\[?([^\]]*)\]?:(\d+)$/.exec(v);
  const port = Number(m?.[2]);
  if (!m || m[1] === undefined || m[1] === "" || !(port >= 0 && port < 65536))
    throw new ForkdError("invalid_argument", `${name} must be HOST:PORT (IPv6: [ADDR]:PORT)`);
  return { host: m[1], port };
}

/** FORKD_E2B_DOMAIN: a DNS name (lowercase labels), or null when unset. */
function e2bDomain(v: string | undefined): string | null {
  if (!v) return null;
  const d = v.toLowerCase();
  if (
    d.length > 200 ||
    !/^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/.test(d)
  )
    throw new ForkdError("invalid_argument", `FORKD_E2B_DOMAIN must be a DNS name, not ${JSON.stringify(v)}`);
  return d;
}
