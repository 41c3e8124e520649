/**
 * `forkd gateway`: a cluster's front door as a process (docs/cluster.md, "Gateway"). Reads its
 * settings from the environment and checks them all before anything connects; connects to etcd
 * (FORKD_CLUSTER, FORKD_CLUSTER_PREFIX), reads the cluster secret (FORKD_CLUSTER_SECRET_FILE:
 * the console's sealed sessions), starts the gateway (src/gateway/) and serves forkd's REST API
 * and the console on FORKD_GATEWAY_LISTEN and E2B's API on FORKD_GATEWAY_E2B_LISTEN, each
 * guarded as a daemon's listeners are (src/util/listener-guard.ts; TLS with FORKD_TLS_CERT and
 * FORKD_TLS_KEY). Nodes at https addresses are reached over TLS, their certificates verified
 * against Node's CAs and FORKD_NODE_CA_FILE's (read once; a bad file stops the start). Callers
 * are authenticated by the cluster's API tokens (etcd's tokens/, followed as they change:
 * src/cluster/cluster-tokens.ts) and FORKD_TOKEN, an admin. SIGTERM/SIGINT stop it: listeners
 * close, open relays get 2 s, the gateway's lease is revoked.
 */
import type { RequestListener, Server } from "node:http";
import { createServer as createHttpServer } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import type { SecureContext } from "node:tls";
import { AuthFailureLimiter, Authenticator, SealedSessions, TokenStore } from "../access/index.js";
import { ADMITTED_PURPOSE, ClusterSecret, weakTokenReason } from "../access/index.js";
import { ClusterKeys, ClusterTokens, DEFAULT_PREFIX } from "../cluster/index.js";
import { listenE2b } from "../e2b/index.js";
import { EtcdKv, parseEndpoints } from "../etcd/index.js";
import { startGateway } from "../gateway/index.js";
import type { GatewayBounds, RunningGateway } from "../gateway/index.js";
import { VERSION, defaultPaths } from "../host/index.js";
import { consoleDist } from "../http/index.js";
import { reservedTags } from "../snapshot/index.js";
import { DEFAULT_LIMITS, ForkdError, guard, httpOptions, jsonLogger, readNodeTrust } from "../util/index.js";
import type { ListenerLimits } from "../util/index.js";
import { int, tcpListeners } from "./config.js";
import type { TcpConfig } from "./config.js";
import { installFailurePolicy } from "./failure-policy.js";
import { runUntilSignal } from "./run-until-signal.js";

export interface GatewayConfig {
  cluster: ReturnType<typeof parseEndpoints>;
  clusterTls: { ca?: string; cert?: string; key?: string };
  prefix: string;
  secret: Buffer;
  rest: TcpConfig;
  e2b: TcpConfig | null;
  adminToken: string | undefined;
  listeners: ListenerLimits;
  bounds: Partial<GatewayBounds>;
  sweepMs: number;
  reserved: ReadonlySet<string>;
  authFailures: { rps: number; burst: number };
  /** FORKD_NODE_CA_FILE: the CAs https nodes' certificates must chain to, besides Node's (null: Node's). */
  nodeTrust: SecureContext | null;
}

/** FORKD_CLUSTER_SECRET_FILE: the cluster secret (src/access/cluster-secret.ts reads and checks it). */
export async function readClusterSecret(path: string | undefined): Promise<Buffer> {
  if (!path)
    throw new ForkdError("invalid_argument", "FORKD_CLUSTER_SECRET_FILE is required (the cluster secret)", {
      field: "FORKD_CLUSTER_SECRET_FILE",
    });
  return (await ClusterSecret.read(path)).bytes();
}

export async function readGatewayConfig(env: NodeJS.ProcessEnv): Promise<GatewayConfig> {
  if (!env.FORKD_CLUSTER)
    throw new ForkdError("invalid_argument", "FORKD_CLUSTER is required (etcd://host:port,...)");
  const cluster = parseEndpoints(env.FORKD_CLUSTER);
  const prefix = env.FORKD_CLUSTER_PREFIX || DEFAULT_PREFIX;
  new ClusterKeys(prefix); // checks it
  const adminToken = env.FORKD_TOKEN || undefined;
  if (adminToken !== undefined) {
    const weak = weakTokenReason(adminToken);
    if (weak) throw new ForkdError("invalid_argument", `FORKD_TOKEN is refused: ${weak}`);
  }
  const { listener, maxConnections } = await tcpListeners(env, 4096);
  const rest = listener("FORKD_GATEWAY_LISTEN", env.FORKD_GATEWAY_LISTEN || "127.0.0.1:8790");
  const e2b = env.FORKD_GATEWAY_E2B_LISTEN
    ? listener("FORKD_GATEWAY_E2B_LISTEN", env.FORKD_GATEWAY_E2B_LISTEN)
    : null;
  if (e2b && e2b.port !== 0 && e2b.port === rest.port && e2b.host === rest.host)
    throw new ForkdError("invalid_argument", "FORKD_GATEWAY_E2B_LISTEN and FORKD_GATEWAY_LISTEN must differ");
  return {
    cluster,
    clusterTls: {
      ...(env.FORKD_CLUSTER_CA ? { ca: env.FORKD_CLUSTER_CA } : {}),
      ...(env.FORKD_CLUSTER_CERT ? { cert: env.FORKD_CLUSTER_CERT } : {}),
      ...(env.FORKD_CLUSTER_KEY ? { key: env.FORKD_CLUSTER_KEY } : {}),
    },
    prefix,
    secret: await readClusterSecret(env.FORKD_CLUSTER_SECRET_FILE),
    rest,
    e2b,
    adminToken,
    listeners: {
      maxConnections,
      perAddress: int(env, "FORKD_CONNECTIONS_PER_ADDRESS", DEFAULT_LIMITS.perAddress, 1),
      headersTimeoutMs: int(env, "FORKD_HEADERS_TIMEOUT_MS", DEFAULT_LIMITS.headersTimeoutMs, 100),
      keepAliveTimeoutMs: int(env, "FORKD_KEEPALIVE_TIMEOUT_MS", DEFAULT_LIMITS.keepAliveTimeoutMs, 100),
    },
    bounds: {
      connectMs: int(env, "FORKD_GATEWAY_CONNECT_MS", 5_000, 100),
      replyMs: int(env, "FORKD_GATEWAY_REPLY_MS", 15 * 60_000, 100),
      forkMs: int(env, "FORKD_GATEWAY_FORK_MS", 15 * 60_000, 100),
      listMs: int(env, "FORKD_GATEWAY_LIST_MS", 10_000, 100),
    },
    sweepMs: int(env, "FORKD_GATEWAY_SWEEP_MS", 10_000, 100),
    reserved: reservedTags(env.FORKD_RESERVED_TAGS),
    authFailures: {
      rps: int(env, "FORKD_AUTH_FAIL_RPS", 1),
      burst: int(env, "FORKD_AUTH_FAIL_BURST", 20, 1),
    },
    nodeTrust: await readNodeTrust(env),
  };
}

/** A guarded HTTP(S) listener of `handler` on `t`. */
async function listen(t: TcpConfig, handler: RequestListener, limits: ListenerLimits): Promise<Server> {
  const l = { ...limits, maxConnections: t.maxConnections };
  const server = t.tls
    ? createHttpsServer(
        { ...httpOptions(l), cert: t.tls.cert, key: t.tls.key, minVersion: "TLSv1.2" },
        handler,
      )
    : createHttpServer(httpOptions(l), handler);
  guard(server, l);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(t.port, t.host, () => resolve());
  });
  return server;
}

export interface GatewayProcess {
  running: RunningGateway;
  /** host:port of each listener. */
  rest: string;
  e2b: string | null;
  reloadTokens(): Promise<void>;
  close(): Promise<void>;
}

const addressOf = (s: Server): string => {
  const a = s.address() as AddressInfo;
  return a.family === "IPv6" ? `[${a.address}]:${a.port}` : `${a.address}:${a.port}`;
};

export async function startGatewayProcess(env: NodeJS.ProcessEnv = process.env): Promise<GatewayProcess> {
  const log = jsonLogger("gateway");
  const cfg = await readGatewayConfig(env);
  const kv = new EtcdKv(cfg.cluster, { tls: cfg.clusterTls });
  const keys = new ClusterKeys(cfg.prefix);
  // The cluster's tokens (etcd), which every node follows too; FORKD_TOKEN is an admin besides.
  const tokens = new TokenStore(
    new ClusterTokens(kv, keys, (what) => log.warn("cluster tokens", { problem: what })),
  );
  const auth = new Authenticator(tokens, cfg.adminToken);
  let running: RunningGateway;
  try {
    await tokens.load();
    running = await startGateway({
      kv,
      keys,
      auth,
      sessions: new SealedSessions(cfg.secret),
      admitted: ClusterSecret.of(cfg.secret).bearer(ADMITTED_PURPOSE),
      log,
      version: VERSION,
      consoleDist: consoleDist(defaultPaths(env).repoDir),
      bounds: cfg.bounds,
      reserved: cfg.reserved,
      authFailures: new AuthFailureLimiter(cfg.authFailures),
      sweepMs: cfg.sweepMs,
      nodeTrust: cfg.nodeTrust,
    });
  } catch (e) {
    await kv.close();
    throw e;
  }
  const servers: Server[] = [];
  const restServer = await listen(cfg.rest, running.rest, cfg.listeners);
  restServer.on("upgrade", running.restUpgrade);
  servers.push(restServer);
  const e2bServer = cfg.e2b
    ? await listenE2b({ ...cfg.e2b }, running.e2b, running.e2bUpgrade, cfg.listeners)
    : null;
  if (e2bServer) servers.push(e2bServer);
  for (const t of [cfg.rest, cfg.e2b])
    if (t && !t.tls && !t.loopback)
      log.warn(
        "a gateway listener without TLS on a non-loopback address: tokens cross the network in clear",
        {
          host: t.host,
        },
      );
  log.info("forkd gateway listening", {
    rest: addressOf(restServer),
    e2b: e2bServer ? addressOf(e2bServer) : null,
    etcd: cfg.cluster.hosts,
    prefix: cfg.prefix,
    nodes: running.gateway.view.nodes().length,
  });
  let closed = false;
  return {
    running,
    rest: addressOf(restServer),
    e2b: e2bServer ? addressOf(e2bServer) : null,
    async reloadTokens() {
      // The cluster's tokens are followed as etcd changes them: nothing to reload.
      log.info("tokens follow the cluster's etcd", { tokens: tokens.size });
    },
    async close() {
      if (closed) return;
      closed = true;
      const closing = Promise.all(servers.map((s) => new Promise<void>((r) => s.close(() => r()))));
      const cut = setTimeout(() => servers.forEach((s) => s.closeAllConnections()), 2_000);
      await closing;
      clearTimeout(cut);
      await running.close();
      await kv.close();
    },
  };
}

/** `forkd gateway`: runs until SIGTERM/SIGINT. */
export async function runGateway(): Promise<void> {
  const log = jsonLogger("gateway");
  const count: { fn: ((kind: string) => void) | null } = { fn: null };
  installFailurePolicy({ log, count: (kind) => count.fn?.(kind) });
  const g = await startGatewayProcess();
  count.fn = (kind) => g.running.gateway.metrics.processFailure(kind);
  runUntilSignal(log, g);
}
