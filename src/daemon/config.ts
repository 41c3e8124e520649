/**
 * The daemon's access settings, read once from the environment and checked before anything
 * listens: the TCP listener (FORKD_LISTEN, with tokens, optionally TLS), E2B's API listener
 * (FORKD_E2B_LISTEN, the same tokens and TLS), request limits, tenants' build caps and the audit log. Every number is
 * validated; a bad setting stops the daemon with a clear message. And the cluster a node joins
 * (FORKD_CLUSTER and its settings: readClusterConfig; none: the daemon runs alone).
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { isIP } from "node:net";
import type { SecureContext } from "node:tls";
import type { AuthFailureLimits } from "../access/index.js";
import { AuthFailureLimiter, RateLimiter, SandboxQuota } from "../access/index.js";
import { ClusterKeys, DEFAULT_PREFIX, assertNodeId } from "../cluster/index.js";
import { parseEndpoints } from "../etcd/index.js";
import type { EtcdEndpoints } from "../etcd/index.js";
import { ClusterSecret } from "../access/index.js";
import { DEFAULT_BUILD_CAPS } from "../access/index.js";
import type { BuildCaps } from "../access/index.js";
import type { RateLimits } from "../access/index.js";
import { weakTokenReason } from "../access/index.js";
import { DEFAULT_BODY_LIMITS } from "../app/index.js";
import type { BodyLimits } from "../app/index.js";
import { ForkdError, errorMessage, readNodeTrust } from "../util/index.js";
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
  /**
   * FORKD_CLUSTER_SECRET_FILE: the cluster's secret (0600, >= 32 bytes), which opens the peer
   * routes (src/peer/) and lets this node pull from its peers; FORKD_PEER_IDLE_MS: how long a
   * pull waits on a silent peer before it moves to another; FORKD_NODE_CA_FILE: the CAs an https
   * peer's certificate must chain to besides Node's (null: Node's). Null: no cluster secret.
   */
  cluster: { secret: ClusterSecret; peerIdleMs: number; nodeTrust: SecureContext | null } | null;
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

/** The API's limits from the access settings: fresh limiters (one set per daemon). */
export function apiLimits(cfg: AccessConfig) {
  return {
    body: cfg.body,
    rate: new RateLimiter(cfg.rate),
    quota: new SandboxQuota(),
    buildCaps: cfg.buildCaps,
    authFailures: new AuthFailureLimiter(cfg.authFailures),
  };
}

export async function readAccessConfig(env: NodeJS.ProcessEnv, dataDir: string): Promise<AccessConfig> {
  const adminToken = env.FORKD_TOKEN || undefined;
  if (adminToken !== undefined) {
    const weak = weakTokenReason(adminToken);
    if (weak) throw new ForkdError("invalid_argument", `FORKD_TOKEN is refused: ${weak}`);
  }
  if (env.FORKD_TLS_CERT && !env.FORKD_LISTEN && !env.FORKD_E2B_LISTEN)
    throw new ForkdError(
      "invalid_argument",
      "FORKD_TLS_CERT/FORKD_TLS_KEY need FORKD_LISTEN or FORKD_E2B_LISTEN",
    );
  const { listener, maxConnections } = await tcpListeners(env, 1024);
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
  const secretFile = env.FORKD_CLUSTER_SECRET_FILE;
  if (env.FORKD_NODE_CA_FILE && !secretFile)
    throw new ForkdError(
      "invalid_argument",
      "FORKD_NODE_CA_FILE (the CA of peers' https addresses) needs FORKD_CLUSTER_SECRET_FILE",
      { field: "FORKD_NODE_CA_FILE" },
    );
  const cluster = secretFile
    ? {
        secret: await ClusterSecret.read(secretFile),
        peerIdleMs: int(env, "FORKD_PEER_IDLE_MS", 30_000, 100),
        nodeTrust: await readNodeTrust(env),
      }
    : null;
  return {
    tcp,
    e2b,
    adminToken,
    cluster,
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
/**
 * How a TCP listener of this process is made (the daemon's and the gateway's alike): the TLS
 * certificate and key (FORKD_TLS_CERT, FORKD_TLS_KEY: both or neither, read once) and the
 * connection bound (FORKD_MAX_CONNECTIONS, default `defaultMax`); the function it returns turns
 * one `host:port` setting into its listener.
 */
export async function tcpListeners(
  env: NodeJS.ProcessEnv,
  defaultMax: number,
): Promise<{ listener: (name: string, v: string) => TcpConfig; maxConnections: number }> {
  const certPath = env.FORKD_TLS_CERT;
  const keyPath = env.FORKD_TLS_KEY;
  if (!certPath !== !keyPath)
    throw new ForkdError("invalid_argument", "FORKD_TLS_CERT and FORKD_TLS_KEY go together");
  const read = (p: string, what: string) =>
    readFile(p).catch((e: unknown) => {
      throw new ForkdError("invalid_argument", `cannot read ${what} ${p}: ${errorMessage(e)}`);
    });
  const tls =
    certPath && keyPath
      ? { cert: await read(certPath, "FORKD_TLS_CERT"), key: await read(keyPath, "FORKD_TLS_KEY") }
      : null;
  const maxConnections = int(env, "FORKD_MAX_CONNECTIONS", defaultMax, 1);
  const listener = (name: string, v: string): TcpConfig => {
    const a = parseListen(name, v);
    return { ...a, loopback: isLoopback(a.host), tls, maxConnections };
  };
  return { listener, maxConnections };
}

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

/** A node's cluster (docs/cluster.md, "Nodes"). */
export interface ClusterConfig {
  /** FORKD_CLUSTER: etcd's members. */
  endpoints: EtcdEndpoints;
  /** FORKD_CLUSTER_CA, _CERT, _KEY: PEM files for an etcds:// cluster. */
  tls: { ca?: string; cert?: string; key?: string };
  /** FORKD_CLUSTER_PREFIX (default /forkd/): the keyspace. */
  keys: ClusterKeys;
  /** FORKD_NODE_ID. */
  nodeId: string;
  /** FORKD_NODE_ADDR: the origin gateways and peers reach this node's REST listener at. */
  api: string;
  /** FORKD_NODE_E2B_ADDR: its E2B listener's origin (null: not served). */
  e2b: string | null;
  /** FORKD_CLUSTER_SECRET_FILE's key (peers authenticate with it). */
  secret: ClusterSecret;
}

/** Settings that mean something only in a cluster (a cluster secret alone opens the peer routes: src/peer/). */
const CLUSTER_ONLY = [
  "FORKD_NODE_ID",
  "FORKD_NODE_ADDR",
  "FORKD_NODE_E2B_ADDR",
  "FORKD_CLUSTER_PREFIX",
  "FORKD_CLUSTER_CA",
  "FORKD_CLUSTER_CERT",
  "FORKD_CLUSTER_KEY",
] as const;

/** The cluster this daemon joins as a node, or null (FORKD_CLUSTER unset: it runs alone). */
export async function readClusterConfig(env: NodeJS.ProcessEnv): Promise<ClusterConfig | null> {
  const bad = (msg: string, field: string) => new ForkdError("invalid_argument", msg, { field });
  if (!env.FORKD_CLUSTER) {
    const set = CLUSTER_ONLY.filter((n) => env[n]);
    if (set.length > 0) throw bad(`${set.join(", ")}: cluster settings; set FORKD_CLUSTER too`, set[0] ?? "");
    return null;
  }
  const endpoints = parseEndpoints(env.FORKD_CLUSTER);
  const id = env.FORKD_NODE_ID ?? "";
  if (!id) throw bad("FORKD_CLUSTER needs FORKD_NODE_ID (this node's name in the cluster)", "FORKD_NODE_ID");
  try {
    assertNodeId(id);
  } catch {
    throw bad(`FORKD_NODE_ID ${JSON.stringify(id)} must match ^[a-z0-9][a-z0-9-]{0,62}$`, "FORKD_NODE_ID");
  }
  if (!env.FORKD_NODE_ADDR)
    throw bad(
      "FORKD_CLUSTER needs FORKD_NODE_ADDR (the http(s) URL peers reach this node at)",
      "FORKD_NODE_ADDR",
    );
  if (!env.FORKD_LISTEN)
    throw bad("FORKD_CLUSTER needs FORKD_LISTEN (the REST listener FORKD_NODE_ADDR reaches)", "FORKD_LISTEN");
  const api = httpOrigin("FORKD_NODE_ADDR", env.FORKD_NODE_ADDR);
  const e2b = env.FORKD_NODE_E2B_ADDR ? httpOrigin("FORKD_NODE_E2B_ADDR", env.FORKD_NODE_E2B_ADDR) : null;
  if (e2b && !env.FORKD_E2B_LISTEN)
    throw bad(
      "FORKD_NODE_E2B_ADDR needs FORKD_E2B_LISTEN (the E2B listener it reaches)",
      "FORKD_NODE_E2B_ADDR",
    );
  if (!env.FORKD_CLUSTER_SECRET_FILE)
    throw bad(
      "FORKD_CLUSTER needs FORKD_CLUSTER_SECRET_FILE (0600, at least 32 bytes: peers authenticate with it)",
      "FORKD_CLUSTER_SECRET_FILE",
    );
  const keys = new ClusterKeys(env.FORKD_CLUSTER_PREFIX || DEFAULT_PREFIX);
  const tls = {
    ...(env.FORKD_CLUSTER_CA ? { ca: env.FORKD_CLUSTER_CA } : {}),
    ...(env.FORKD_CLUSTER_CERT ? { cert: env.FORKD_CLUSTER_CERT } : {}),
    ...(env.FORKD_CLUSTER_KEY ? { key: env.FORKD_CLUSTER_KEY } : {}),
  };
  if (!endpoints.tls && Object.keys(tls).length > 0)
    throw bad("FORKD_CLUSTER_CA/_CERT/_KEY need an etcds:// FORKD_CLUSTER", "FORKD_CLUSTER");
  if (!tls.cert !== !tls.key)
    throw bad("FORKD_CLUSTER_CERT and FORKD_CLUSTER_KEY go together", "FORKD_CLUSTER_CERT");
  return {
    endpoints,
    tls,
    keys,
    nodeId: id,
    api,
    e2b,
    secret: await ClusterSecret.read(env.FORKD_CLUSTER_SECRET_FILE),
  };
}

/** An http(s) origin (scheme, host, optional port; no path, query or credentials), normalized. */
export function httpOrigin(name: string, v: string): string {
  const bad = () =>
    new ForkdError(
      "invalid_argument",
      `${name} must be an http(s) origin like http://10.0.0.5:7000 (no path), not ${JSON.stringify(v)}`,
      { field: name },
    );
  let u: URL;
  try {
    u = new URL(v);
  } catch {
    throw bad();
  }
  if (
    (u.protocol !== "http:" && u.protocol !== "https:") ||
    u.username ||
    u.password ||
    u.pathname !== "/" ||
    u.search ||
    u.hash ||
    !u.hostname
  )
    throw bad();
  const origin = u.origin;
  if (origin.length > 512 || !/^https?:\/\/[^\s/]+$/.test(origin)) throw bad();
  return origin;
}
