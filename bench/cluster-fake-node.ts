/**
 * One cluster node for the scale benchmark (bench/cluster-scale.ts): the daemon's own parts as
 * `forkd daemon` builds them in cluster mode (src/daemon/main.ts: its access settings read by
 * readAccessConfig, an etcd client of its own, ClusterNode, the snapshot store, the sandbox and
 * snapshot services, the cluster's tokens, the audit log, the REST app on a guarded TCP
 * listener), only its VMMs are the fake driver's (test/fakes/vmm.ts) with light guests (no agent
 * process: test/fakes/guest.ts). Left out, as no create, list or delete needs them: the E2B
 * listener, the peer routes (every node holds the snapshot), networking (sandboxes have no NIC),
 * the warm pool (its warm-up runs cells) and the Prometheus metrics. The snapshot `base` is made
 * on every node before it joins, byte for byte the same, so every node holds it under one digest.
 */
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { Authenticator, TokenStore } from "../src/access/index.js";
import { createApp, snapshotView } from "../src/api/index.js";
import { NO_METRICS } from "../src/app/services.js";
import { AuditLog } from "../src/audit/index.js";
import { ClusterKeys, ClusterNode, ClusterTokens } from "../src/cluster/index.js";
import { listenTcp } from "../src/daemon/main.js";
import { apiLimits, readAccessConfig } from "../src/daemon/config.js";
import { EtcdKv, parseEndpoints } from "../src/etcd/index.js";
import { EventBus } from "../src/events/index.js";
import { ImageBuilder } from "../src/image/index.js";
import { registrySettings } from "../src/registry/index.js";
import { SandboxService } from "../src/sandbox/index.js";
import { BlobCache, SnapshotService, SnapshotStore } from "../src/snapshot/index.js";
import type { Logger } from "../src/util/index.js";
import { JailedTools } from "../src/vmm/index.js";
import { fakeSnapshot } from "../test/helpers/snapshots.js";
import { FakeStrays } from "../test/fakes/strays.js";
import { FakeHost } from "../test/fakes/vmm.js";

/** The machine every bench node runs (and the fake snapshot records). */
export const BENCH_MACHINE = { accel: "tcg" as const, qemu: "0", cpu: "qemu64" };
export const BENCH_TAG = "base";

export interface BenchNodeOptions {
  id: string;
  /** Its data directory (made). */
  dir: string;
  /** etcd://H:P[,...] */
  cluster: string;
  prefix: string;
  adminToken: string;
  maxSandboxes: number;
  /** Settings the daemon reads from its environment (FORKD_RATE_RPS ...), over a default daemon's. */
  env?: Record<string, string>;
  log: Logger;
}

export interface BenchNode {
  id: string;
  /** Its REST origin (FORKD_NODE_ADDR). */
  api: string;
  /** Every sandbox killed, the node leaving the cluster (its lease revoked), the listener closed. */
  close(): Promise<void>;
}

export async function startBenchNode(o: BenchNodeOptions): Promise<BenchNode> {
  await mkdir(o.dir, { recursive: true, mode: 0o700 });
  for (const d of ["snapshots", "sandboxes", "run"]) await mkdir(join(o.dir, d), { recursive: true });
  // The daemon's own reading of its settings: its limits are a default daemon's.
  const cfg = await readAccessConfig(
    { ...o.env, FORKD_LISTEN: "127.0.0.1:0", FORKD_TOKEN: o.adminToken },
    o.dir,
  );
  const tcp = cfg.tcp;
  if (!tcp) throw new Error("no TCP listener");
  // The listener first: the node's record names its address.
  const late: { app: ReturnType<typeof createApp> | null } = { app: null };
  const server: Server = await listenTcp(
    tcp,
    {
      fetch: (req, ...rest) =>
        late.app ? late.app.fetch(req, ...rest) : new Response("starting", { status: 503 }),
    },
    cfg.listeners,
  );
  const api = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const kv = new EtcdKv(parseEndpoints(o.cluster));
  const keys = new ClusterKeys(o.prefix);
  const host = new FakeHost({ light: true });
  const events = new EventBus();
  const node = new ClusterNode({
    kv,
    keys,
    id: o.id,
    api,
    e2b: null,
    version: "bench",
    machine: BENCH_MACHINE,
    maxSandboxes: o.maxSandboxes,
    dir: join(o.dir, "cluster"),
    log: o.log,
    view: (meta) => snapshotView(meta),
  });
  const store = new SnapshotStore(join(o.dir, "snapshots"), events, node);
  const tools = new JailedTools(null, null);
  const sandboxes = new SandboxService({
    root: join(o.dir, "sandboxes"),
    store,
    driver: host.driver(),
    log: o.log,
    strays: new FakeStrays(host, o.log),
    memory: host.memory,
    maxSandboxes: o.maxSandboxes,
    events,
    tools,
    cluster: node,
  });
  const snapshots = new SnapshotService({
    store,
    create: {
      store,
      driver: host.driver(),
      images: new ImageBuilder(o.dir, o.dir),
      accel: { accel: "tcg", forced: true, reason: "bench", tscKhz: 1 },
      qemuVersion: BENCH_MACHINE.qemu,
      runDir: join(o.dir, "run"),
      tools,
    },
    transfer: { store, blobs: new BlobCache(join(o.dir, "blobs")), registry: registrySettings({}) },
    cacheDir: o.dir,
    accel: "tcg",
    sandboxes,
    log: o.log,
  });
  await fakeSnapshot(store, BENCH_TAG, null);
  await store.recover();
  await sandboxes.recover();
  await node.start({ store, sandboxes, snapshots, events });
  const clusterTokens = new ClusterTokens(kv, keys, (what) => o.log.warn("cluster tokens", { what }));
  const tokens = new TokenStore(clusterTokens);
  await tokens.load();
  const auth = new Authenticator(tokens, cfg.adminToken);
  const audit = await AuditLog.open({ ...cfg.audit });
  late.app = createApp(
    {
      store,
      sandboxes,
      snapshots,
      log: o.log,
      info: {
        version: "bench",
        accel: { accel: "tcg", forced: true, reason: "bench", tscKhz: 1 },
        qemu: { binary: "/nonexistent/forkd-fake-vmm", version: BENCH_MACHINE.qemu },
        startedAt: new Date().toISOString(),
        node: o.id,
        cacheDir: o.dir,
        hostDirs: { data: o.dir },
      },
      tokens,
      limits: apiLimits(cfg),
      metrics: NO_METRICS,
      audit,
      events,
    },
    { auth },
  );
  return {
    id: o.id,
    api,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      await sandboxes.killAll().catch(() => undefined);
      await node.close().catch(() => undefined);
      await clusterTokens.close().catch(() => undefined);
      await kv.close();
      await audit.close();
      await host.close();
    },
  };
}
