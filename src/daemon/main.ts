/**
 * The daemon: the single owner of snapshots and sandboxes. Builds every service, recovers state
 * left by an earlier daemon (re-adopting running children), and serves the API on a unix socket
 * (mode 0600: the local admin) and, with bearer tokens, on TCP (optionally TLS). Every listener
 * shares the limits, the audit log and the metrics. With FORKD_CLUSTER it is a node of a
 * cluster (src/cluster/node.ts): it joins before it serves, and its store and sandbox service
 * are given the cluster; without, it runs alone exactly as before.
 * With a cluster secret, the TCP listener also serves the peer routes (/peer/v1/: src/peer/),
 * through which other nodes pull snapshots.
 */
import { parseLiveMode } from "../vmm/index.js";
import { Cgroups } from "../host/index.js";
import { hideRoots, Jail, jailEnabled, jailOptions } from "../vmm/index.js";
import { claimUidRange, jailGid } from "../vmm/index.js";
import { chmod, mkdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { Server } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { guard, httpOptions } from "../util/index.js";
import type { ListenerLimits } from "../util/index.js";
import { createAdaptorServer } from "@hono/node-server";
import { ADMITTED_PURPOSE, PEER_PURPOSE } from "../access/index.js";
import { createPeerApp } from "../peer/index.js";
import { Authenticator, TokenStore } from "../access/index.js";
import { createApp } from "../api/index.js";
import { EventBus } from "../events/index.js";
import { wsUpgradeHandler } from "../http/index.js";
import { TERMINAL_UPGRADE } from "../api/index.js";
import { consoleDist } from "../http/index.js";
import { ConsoleSessions } from "../access/index.js";
import type { ApiServices } from "../api/index.js";
import type { ClusterAdmission } from "../app/index.js";
import type { E2bServices } from "../e2b/index.js";
import { AuditLog } from "../audit/index.js";
import { WebhookService, webhookSettings } from "../webhooks/index.js";
import { SharingProbe } from "../metrics/index.js";
import { Metrics } from "../metrics/index.js";
import { apiLimits, readAccessConfig, readClusterConfig } from "./config.js";
import { ClusterNode, ClusterTokens, peerTransferUnavailable } from "../cluster/index.js";
import type { PeerPull, RegistryPull } from "../cluster/index.js";
import { EtcdKv } from "../etcd/index.js";
import { snapshotView } from "../api/index.js";
import { defaultCpu } from "../vmm/index.js";
import { reservedTags } from "../snapshot/index.js";
import type { TcpConfig } from "./config.js";
import { chooseAccel } from "../vmm/index.js";
import { defaultPaths, sandboxesDir, snapshotsDir } from "../host/index.js";
import type { Paths } from "../host/index.js";
import { findQemu, qemuVersion } from "../vmm/index.js";
import { CacheKeeper, cacheSettingsFromEnv } from "../cache/index.js";
import { ImageBuilder } from "../image/index.js";
import { unpackMaxFromEnv } from "../snapshot/index.js";
import { SandboxService } from "../sandbox/index.js";
import { SnapshotService } from "../snapshot/index.js";
import { buildNetworkOf } from "../snapshot/index.js";
import { SnapshotStore } from "../snapshot/index.js";
import { BlobCache } from "../snapshot/index.js";
import { registrySettings } from "../registry/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { jsonLogger } from "../util/index.js";
import { QemuDriver } from "../vmm/index.js";
import { JailedTools } from "../vmm/index.js";
import { findJailer, findMemsnap } from "../host/index.js";
import { NetworkService } from "../net/index.js";
import { VERSION } from "../host/index.js";
import { acquireDaemonLock } from "../host/index.js";
import { poolConfig } from "./pool-config.js";
import { crashPointFromEnv } from "../util/index.js";
import { LocalImages } from "../image/index.js";
import { imageLimitsFromEnv } from "../oci/index.js";
import { ImagePuller } from "../oci/index.js";
import { Quarantine } from "../util/index.js";
import { Strays } from "../vmm/index.js";
import { installFailurePolicy } from "./failure-policy.js";
import { runUntilSignal } from "./run-until-signal.js";
import { AccessTokens } from "../e2b/index.js";
import { createE2bHandler, createE2bUpgradeHandler, listenE2b } from "../e2b/index.js";
import { interpreterHandler } from "../e2b/index.js";

export interface DaemonOptions {
  paths?: Paths;
  env?: NodeJS.ProcessEnv;
}

export interface Daemon {
  services: ApiServices & E2bServices;
  /** Re-reads the tokens file (SIGHUP); a bad file keeps the tokens in force. */
  reloadTokens(): Promise<void>;
  close(opts?: { killSandboxes?: boolean }): Promise<void>;
}

export async function startDaemon(opts: DaemonOptions = {}): Promise<Daemon> {
  const env = opts.env ?? process.env;
  const paths = opts.paths ?? defaultPaths(env);
  const log = jsonLogger("daemon");
  // Every access setting is checked before anything is touched.
  const cfg = await readAccessConfig(env, paths.dataDir);
  // The cluster this daemon is a node of (null: alone), checked as strictly.
  const clusterCfg = await readClusterConfig(env);
  // Tags no tenant may take (src/snapshot/namespace.ts): a bad one stops the start here.
  const reserved = reservedTags(env.FORKD_RESERVED_TAGS);
  const poolCfg = poolConfig(env);
  const cacheSettings = cacheSettingsFromEnv(env);
  await mkdir(paths.dataDir, { recursive: true, mode: 0o700 });
  const runDir = join(paths.dataDir, "run");
  for (const d of [snapshotsDir(paths), sandboxesDir(paths), runDir])
    await mkdir(d, { recursive: true, mode: 0o700 });

  const releaseLock = await acquireDaemonLock(paths.dataDir);
  // We own the data directory now: a socket file left here belongs to a dead daemon.
  await rm(paths.socket, { force: true });
  // Test-only (FORKD_TEST_CRASH_AT): read once here and injected.
  const crash = crashPointFromEnv(env);

  const accel = await chooseAccel(await findQemu(env), env);
  const qemu = await findQemu(env, accel.accel);
  const qemuVer = await qemuVersion(qemu);
  if (accel.accel === "tcg" && !accel.forced) {
    log.warn(`no usable KVM: running guests under TCG software emulation (slow). Reason: ${accel.reason}`);
  }
  // Every VMM is jailed: its own uid, a mount namespace without the data and cache directories
  // (but its own files), a cgroup with its limits (src/vmm/jail.ts).
  const cgroups = await Cgroups.detect("/sys/fs/cgroup", env);
  const kvmGroup =
    accel.accel === "kvm"
      ? await stat("/dev/kvm").then(
          (s) => s.gid,
          () => null,
        )
      : null;
  // Its VMMs' uids are this data directory's alone: no two daemons' VMMs share one.
  const uids = jailEnabled(env) ? await claimUidRange(paths.dataDir, env) : null;
  const jailOpts = uids
    ? jailOptions(
        uids,
        jailGid(env, uids),
        await hideRoots([paths.dataDir, paths.cacheDir]),
        kvmGroup ? [kvmGroup] : [],
      )
    : null;
  if (jailOpts) log.info("jail", { uid_base: jailOpts.uidBase, uids: jailOpts.uidCount, gid: jailOpts.gid });
  if (!jailOpts) log.warn("VMMs are not jailed (the daemon is not root, or FORKD_JAIL=off)");
  if (cgroups.mode === "none") log.warn(`no per-sandbox resource limits: ${cgroups.reason ?? ""}`);
  const jail = new Jail(jailOpts, cgroups);
  const jailer = await findJailer(env);
  const memsnap = await findMemsnap(env);
  const driver = new QemuDriver(qemu, { jailer, jail });
  // qemu-img and e2fsck on what guests and tenants wrote run jailed too, from the same uid pool
  // (src/vmm/jailed-tools.ts).
  const tools = new JailedTools(jail, jailer);
  if (!tools.jailed) log.warn("host tools (qemu-img, e2fsck) on guests' disks are not jailed");
  // What changes in sandboxes and snapshots, told as it happens (GET /v1/events).
  const events = new EventBus();
  const maxSandboxes = Number(env.FORKD_MAX_SANDBOXES ?? 1000);
  // A node of a cluster: its store and sandbox service are given it; it joins once they recovered.
  const kv = clusterCfg ? new EtcdKv(clusterCfg.endpoints, { tls: clusterCfg.tls }) : null;
  // A snapshot this node lacks is pulled from its holders by the snapshot service (made below).
  const peerPull: { fn: PeerPull } = { fn: peerTransferUnavailable };
  const registryPull: { fn: RegistryPull } = {
    fn: async () => {
      throw new ForkdError("unavailable", "registry pulls start with the snapshot service");
    },
  };
  const node =
    clusterCfg && kv
      ? new ClusterNode({
          kv,
          keys: clusterCfg.keys,
          id: clusterCfg.nodeId,
          api: clusterCfg.api,
          e2b: clusterCfg.e2b,
          version: VERSION,
          machine: { accel: accel.accel, qemu: qemuVer, cpu: defaultCpu(accel.accel, env) },
          maxSandboxes,
          dir: join(paths.dataDir, "cluster"),
          log,
          view: (meta) => snapshotView(meta),
          pull: (key, holders) => peerPull.fn(key, holders),
          fromRegistry: (push, owners) => registryPull.fn(push, owners),
        })
      : null;
  const store = new SnapshotStore(snapshotsDir(paths), events, node);
  const network = await NetworkService.start({
    dataDir: paths.dataDir,
    env,
    log,
    qemuBinary: qemu,
    jailer,
    protectedPorts: [...(cfg.tcp ? [cfg.tcp.port] : []), ...(cfg.e2b ? [cfg.e2b.port] : [])],
  });
  // A dead daemon's children outlive it: a snapshot's parent VM or a Dockerfile build VM
  // (running from run/), helpers writing a branch or an unpack. They are
  // stopped before their directories go; sandboxes' VMMs are re-adopted (or stopped) by
  // sandboxes.recover() below.
  const strays = new Strays(
    [qemu, jailer, memsnap, ...(network.caps.user.binary ? [network.caps.user.binary] : [])],
    log,
  );
  await strays.kill([`${runDir}/`, join(snapshotsDir(paths), ".staging-")], "a dead daemon's build");
  await rm(runDir, { recursive: true, force: true });
  await mkdir(runDir, { recursive: true, mode: 0o700 });
  const quarantine = new Quarantine(join(paths.dataDir, "quarantine"), log);
  const sandboxes = new SandboxService({
    root: sandboxesDir(paths),
    store,
    driver,
    cgroups,
    log,
    // A hot pool member's warm-up translates ~35 MiB of code (pool-warm.ts); a full buffer makes
    // QEMU discard every translation, so 32 MiB threw most of the warm-up away before a fork took it.
    tbSizeMiB: Number(env.FORKD_TB_SIZE_MIB ?? 64),
    pool: poolCfg,
    poolSize: poolCfg.perTag,
    forkParallelism: Number(env.FORKD_FORK_PARALLELISM ?? 0) || undefined,
    maxSandboxes,
    memsnap,
    branchLive: parseLiveMode(env.FORKD_BRANCH_LIVE),
    network,
    strays,
    quarantine,
    crash,
    events,
    tools,
    ...(node ? { cluster: node } : {}),
  });
  const cleaned = await store.recover(quarantine);
  const { adopted, removed, quarantined } = await sandboxes.recover();
  // After re-adopting children: their slots keep their rules, every other one is reclaimed.
  await network.reclaim();
  log.info("state recovered", {
    adopted: adopted.length,
    removed: removed.length,
    quarantined: quarantined.length,
    staging_cleaned: cleaned.length,
  });

  // A node's tokens are the cluster's (etcd: every node and gateway follows them); alone, its file.
  const tokens = new TokenStore(
    clusterCfg && kv
      ? new ClusterTokens(kv, clusterCfg.keys, (what) => log.warn("cluster tokens", { problem: what }))
      : cfg.tokensFile,
  );
  await tokens.load();
  const auth = new Authenticator(tokens, cfg.adminToken);
  // A node may start with none: the cluster's first token is made through a node's unix socket
  // (docs/cluster.md, "The first admin token"); meanwhile its listeners refuse every request.
  if (cfg.e2b && !cfg.e2b.loopback && !auth.hasTokens && !clusterCfg) {
    throw new ForkdError(
      "invalid_argument",
      `FORKD_E2B_LISTEN on ${cfg.e2b.host} (not loopback) needs a key: create one first ` +
        `(forkd token create --tenant T --e2b) into ${tokens.backing.where}, or set FORKD_TOKEN`,
    );
  }
  if (cfg.tcp && !cfg.tcp.loopback && !auth.hasTokens && !clusterCfg) {
    throw new ForkdError(
      "invalid_argument",
      `FORKD_LISTEN on ${cfg.tcp.host} (not loopback) needs a token: set FORKD_TOKEN, or create ` +
        `tokens first (forkd token create) into ${tokens.backing.where}`,
    );
  }
  // Lifecycle webhooks: told of what the bus tells from now on (the sandboxes recovered above are
  // known, not told created); what was queued before a restart is sent again.
  const webhooks = new WebhookService({
    dir: join(paths.dataDir, "webhooks"),
    events,
    sandboxes: () => sandboxes.list(),
    isReady: (tag) => store.has(tag),
    log,
    settings: webhookSettings(env),
    node: clusterCfg?.nodeId ?? null,
  });
  await webhooks.start();
  const audit = await AuditLog.open({
    ...cfg.audit,
    onError: (e) => log.warn("audit log write failed", { error: errorMessage(e) }),
  });
  const metrics = new Metrics({
    version: VERSION,
    sandboxStates: () => {
      const by: Record<string, number> = {};
      for (const v of sandboxes.list()) by[v.state] = (by[v.state] ?? 0) + 1;
      return by;
    },
    snapshotStatuses: async () => {
      const by: Record<string, number> = { ready: (await store.list()).length };
      for (const p of await store.listPending()) by[p.status] = (by[p.status] ?? 0) + 1;
      return by;
    },
    poolSize: () => sandboxes.poolState().total,
    pool: () => sandboxes.poolState(),
    sharing: new SharingProbe(() =>
      sandboxes
        .list()
        .filter((sb) => sb.state === "running")
        .map((sb) => sb.record.pid),
    ),
    audit: () => audit.stats,
    webhooks: () => ({ ...webhooks.stats, queued: webhooks.queued() }),
    toolRuns: () => tools.runs(),
  });
  // Its builds run in process groups of their own: close() stops them (the group, not just bash).
  const imageBuilder = new ImageBuilder(paths.repoDir, paths.cacheDir, { mirror: env.FORKD_MIRROR, env });
  // The shared cache: this data directory recorded as its user (so a collection anywhere keeps
  // what its snapshots name), pins, and with FORKD_CACHE_MAX_GIB a bounded collection at start
  // and after builds (src/cache/keeper.ts).
  const cache = new CacheKeeper(paths.cacheDir, paths.dataDir, cacheSettings, log);
  await cache.start();
  const snapshots = new SnapshotService({
    store,
    // Snapshots from images: pulled into <cache>/oci/ with the registry settings push and pull
    // use; tests may name local trees instead (FORKD_TEST_IMAGES: image/local-images.ts).
    images: env.FORKD_TEST_IMAGES
      ? new LocalImages(env.FORKD_TEST_IMAGES)
      : new ImagePuller({
          cacheDir: paths.cacheDir,
          settings: registrySettings(env),
          limits: imageLimitsFromEnv(env),
        }),
    create: {
      store,
      driver,
      images: imageBuilder,
      accel,
      qemuVersion: qemuVer,
      runDir,
      crash,
      tools,
    },
    transfer: {
      store,
      blobs: new BlobCache(join(paths.dataDir, "registry", "blobs")),
      registry: registrySettings(env),
      unpackMaxBytes: unpackMaxFromEnv(env),
    },
    cacheDir: paths.cacheDir,
    accel: accel.accel,
    sandboxes,
    log,
    crash,
    buildNetwork: buildNetworkOf(network),
    cache,
    reservedTags: reserved,
    ...(cfg.cluster
      ? {
          peer: {
            bearer: cfg.cluster.secret.bearer(PEER_PURPOSE),
            idleMs: cfg.cluster.peerIdleMs,
            ...(cfg.cluster.nodeTrust ? { trust: cfg.cluster.nodeTrust } : {}),
            onBytes: (n: number) => metrics.peerPulled(n),
            onPull: (result: "ok" | "failed") => metrics.peerPull(result),
          },
        }
      : {}),
  });
  peerPull.fn = async (key, holders) => {
    await snapshots.pullFromPeers(key, holders);
  };
  registryPull.fn = async (push, owners) => {
    try {
      await snapshots.pullFromRegistry({
        ref: push.ref,
        digest: push.digest,
        insecure: push.insecure,
        keys: push.chain.map((x) => x.key),
        owners,
      });
    } catch (e) {
      metrics.registryFallbackPull("failed");
      throw e;
    }
    metrics.registryFallbackPull("ok");
  };
  // A node joins now (what survived is recovered): reconciled with the cluster before it serves.
  if (node) {
    try {
      await node.start({ store, sandboxes, snapshots, events });
    } catch (e) {
      await kv?.close();
      throw new ForkdError(
        e instanceof ForkdError ? e.code : "unavailable",
        `node ${node.id} cannot join the cluster (${env.FORKD_CLUSTER ?? ""}): ${errorMessage(e)}`,
        {},
        e,
      );
    }
  }
  // A node's tenants' quotas hold across the cluster (src/app/fork.ts withQuota).
  const secret = cfg.cluster?.secret;
  const admission: ClusterAdmission | null =
    node && secret
      ? {
          admits: (header) => secret.accepts(header, ADMITTED_PURPOSE),
          reserve: (tenant, max, n) => node.reserve(tenant, max, n),
        }
      : null;
  const services: ApiServices & E2bServices = {
    store,
    sandboxes,
    snapshots,
    log,
    info: {
      version: VERSION,
      accel,
      qemu: { binary: qemu, version: qemuVer },
      startedAt: new Date().toISOString(),
      node: clusterCfg?.nodeId ?? null,
      cacheDir: paths.cacheDir,
      hostDirs: { data: paths.dataDir, cache: paths.cacheDir, forkd: paths.repoDir },
    },
    tokens,
    limits: apiLimits(cfg),
    metrics,
    audit,
    events,
    webhooks,
    console: { dist: consoleDist(paths.repoDir), sessions: new ConsoleSessions() },
    ...(admission ? { cluster: admission } : {}),
    ...(cfg.e2b
      ? {
          e2b: {
            auth,
            accessTokens: await AccessTokens.open(paths.dataDir),
            domain: cfg.e2b.domain,
          },
        }
      : {}),
  };
  const servers: Server[] = [];
  const unixApp = createApp(services);
  const unix = unixServer(unixApp, cfg.listeners);
  // WebSockets (the console's terminal) go through the same app: ../http/ws-upgrade.ts.
  const upgradeFailed = (e: unknown) => log.warn("websocket upgrade failed", { error: errorMessage(e) });
  unix.on("upgrade", wsUpgradeHandler(unixApp, TERMINAL_UPGRADE, upgradeFailed));
  // The socket must never exist with looser permissions, not even between bind and chmod.
  const oldUmask = process.umask(0o077);
  try {
    await listen(unix, paths.socket);
  } finally {
    process.umask(oldUmask);
  }
  await chmod(paths.socket, 0o600);
  servers.push(unix);

  let tcpAddress: string | null = null;
  if (cfg.tcp) {
    const tcpApp = createApp(services, { auth });
    // With a cluster secret, /peer/ is the peer routes' (src/peer/): other nodes pull snapshots there.
    const peerApp = cfg.cluster ? createPeerApp({ snapshots, secret: cfg.cluster.secret, log }) : null;
    const server = await listenTcp(
      cfg.tcp,
      peerApp ? withPeerRoutes(tcpApp, peerApp) : tcpApp,
      cfg.listeners,
    );
    server.on("upgrade", wsUpgradeHandler(tcpApp, TERMINAL_UPGRADE, upgradeFailed));
    servers.push(server);
    const a = server.address();
    tcpAddress = a && typeof a === "object" ? `${a.address}:${a.port}` : null;
    if (!auth.hasTokens)
      log.warn("TCP listener has no tokens yet: every request is refused until one is created");
    if (!cfg.tcp.tls && !cfg.tcp.loopback)
      log.warn("TCP listener without TLS on a non-loopback address: tokens cross the network in clear");
  }
  let e2bAddress: string | null = null;
  if (cfg.e2b) {
    const server = await listenE2b(
      cfg.e2b,
      createE2bHandler(services, { interpreter: interpreterHandler(services) }),
      createE2bUpgradeHandler(services),
      cfg.listeners,
    );
    servers.push(server);
    const a = server.address();
    e2bAddress = a && typeof a === "object" ? `${a.address}:${a.port}` : null;
    if (a && typeof a === "object")
      services.info.e2b = { url: e2bUrl(cfg.e2b, a.port), domain: cfg.e2b.domain };
    if (!cfg.e2b.tls && !cfg.e2b.loopback)
      log.warn("E2B listener without TLS on a non-loopback address: keys cross the network in clear");
  }
  if (cfg.cluster && !cfg.tcp)
    log.warn("FORKD_CLUSTER_SECRET_FILE is set but FORKD_LISTEN is not: peers cannot pull from this node");
  log.info("forkd daemon listening", {
    socket: paths.socket,
    tcp: tcpAddress,
    e2b: e2bAddress,
    tls: cfg.tcp?.tls ? true : false,
    tokens: tokens.size,
    audit: audit.path,
    accel: accel.accel,
    qemu: qemuVer,
  });

  let closed = false;
  return {
    services,
    async reloadTokens() {
      try {
        await tokens.load();
        log.info("tokens reloaded", { tokens: tokens.size });
      } catch (e) {
        log.warn("tokens file not reloaded; the previous tokens stay in force", { error: errorMessage(e) });
      }
    },
    async close(o = {}) {
      if (closed) return;
      closed = true;
      // Stop accepting; give in-flight requests a moment, then cut streams that would hold us.
      const closing = Promise.all(servers.map((s) => new Promise<void>((r) => s.close(() => r()))));
      const cut = setTimeout(() => servers.forEach((s) => s.closeAllConnections()), 2_000);
      await closing;
      clearTimeout(cut);
      await imageBuilder.close();
      await cache.close();
      if (o.killSandboxes) await sandboxes.killAll();
      else await sandboxes.detachAll();
      // A node leaves: its lease revoked (record and holdings gone); sandboxes left running are
      // reconciled by the next start.
      await node?.close();
      await kv?.close();
      // After the sandboxes' last events: those are queued (and written) for the next start.
      await webhooks.close();
      await audit.close();
      // Slots stay for children left running (a restarted daemon re-adopts them); with none
      // left, this daemon's namespaces, interfaces and host table go, so a stopped daemon leaves
      // nothing in the kernel (left-over slot routes would also push other daemons' blocks aside).
      if (sandboxes.list().some((v) => v.state === "running")) await network.close();
      else await network.teardown();
      await rm(paths.socket, { force: true });
      await uids?.release();
      await releaseLock();
    },
  };
}

/**
 * The unix socket's server, guarded (../util/listener-guard.ts) but for the per-address bound:
 * every peer of the socket is "local", the local admin.
 */
export function unixServer(
  app: { fetch: ReturnType<typeof createApp>["fetch"] },
  limits: ListenerLimits,
): Server {
  const server = createAdaptorServer({ fetch: app.fetch, serverOptions: httpOptions(limits) }) as Server;
  guard(server, { ...limits, perAddress: limits.maxConnections });
  return server;
}

type Fetch = ReturnType<typeof createApp>["fetch"];

/** `app`, but requests whose path starts with /peer/ go to `peer` (src/peer/). */
function withPeerRoutes(app: { fetch: Fetch }, peer: { fetch: Fetch }): { fetch: Fetch } {
  return {
    fetch: (req, ...rest) =>
      (new URL(req.url).pathname.startsWith("/peer/") ? peer : app).fetch(req, ...rest),
  };
}

/** The TCP listener (HTTPS with a certificate), guarded (../util/listener-guard.ts). */
export async function listenTcp(
  t: TcpConfig,
  app: { fetch: ReturnType<typeof createApp>["fetch"] },
  limits: ListenerLimits,
): Promise<Server> {
  const fetch = app.fetch;
  const l = { ...limits, maxConnections: t.maxConnections };
  const server = (
    t.tls
      ? createAdaptorServer({
          fetch,
          createServer: createHttpsServer,
          serverOptions: { ...httpOptions(l), cert: t.tls.cert, key: t.tls.key, minVersion: "TLSv1.2" },
        })
      : createAdaptorServer({ fetch, serverOptions: httpOptions(l) })
  ) as Server;
  guard(server, l);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(t.port, t.host, () => resolve());
  });
  return server;
}

/** The E2B listener's URL as a client on this host reaches it (an unspecified address: loopback). */
function e2bUrl(t: TcpConfig, port: number): string {
  const host = t.host === "0.0.0.0" ? "127.0.0.1" : t.host === "::" ? "::1" : t.host;
  return `${t.tls ? "https" : "http"}://${host.includes(":") ? `[${host}]` : host}:${port}`;
}

function listen(server: Server, path: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(path, () => resolve());
  });
}

/** `forkd daemon`: run until SIGTERM/SIGINT; running sandboxes are left for the next daemon. */
export async function runDaemon(): Promise<void> {
  const log = jsonLogger("daemon");
  // Installed first: a failure while starting is handled the same way.
  let metrics: Metrics | null = null;
  installFailurePolicy({ log, count: (kind) => metrics?.processFailure(kind) });
  const d = await startDaemon();
  if (d.services.metrics instanceof Metrics) metrics = d.services.metrics;
  runUntilSignal(log, d);
}
