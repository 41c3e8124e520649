/**
 * A cluster node for unit tests: a daemon's store, sandbox service (over the fake VMM:
 * test/fakes/vmm.ts) and snapshot service, joined to a cluster in a FakeKv (test/fakes/kv.ts)
 * as src/daemon/main.ts joins them to etcd. restart() is a daemon restart (sandboxes detached
 * and adopted by the next one); make() seals a snapshot the way every creation does (claim,
 * stage, seal), without a VM.
 */
import { appendFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ClusterNode } from "../../src/cluster/node.js";
import type { ClusterNodeOptions } from "../../src/cluster/node.js";
import type { PeerPull } from "../../src/cluster/ensure.js";
import { ClusterKeys } from "../../src/cluster/keys.js";
import { EventBus } from "../../src/events/bus.js";
import { ImageBuilder } from "../../src/image/builder.js";
import { registrySettings } from "../../src/registry/settings.js";
import { SandboxService } from "../../src/sandbox/service.js";
import { BlobCache } from "../../src/snapshot/blobs.js";
import type { SnapshotMeta } from "../../src/snapshot/meta.js";
import type { SealMeta } from "../../src/snapshot/seal.js";
import { SnapshotService } from "../../src/snapshot/service.js";
import { SnapshotStore, snapshotFiles } from "../../src/snapshot/store.js";
import { JailedTools } from "../../src/vmm/jailed-tools.js";
import type { FakeKv } from "../fakes/kv.js";
import { FakeStrays } from "../fakes/strays.js";
import { FakeHost } from "../fakes/vmm.js";
import { fakeMeta, fakeSnapshot } from "./snapshots.js";

export const KEYS = new ClusterKeys("/t/");
export const MACHINE = { accel: "tcg" as const, qemu: "0", cpu: "qemu64" };

export interface TestNode {
  id: string;
  data: string;
  host: FakeHost;
  store: SnapshotStore;
  events: EventBus;
  svc: SandboxService;
  snapshots: SnapshotService;
  node: ClusterNode;
  warnings: string[];
  /** Seals snapshot `tag` here (its content: `content`; a branch of `parent`). */
  make(tag: string, o?: { parent?: string; content?: string; owner?: string | null }): Promise<SnapshotMeta>;
  /** A daemon restart on the same data dir and host (the old node's lease is left as it is). */
  restart(): Promise<void>;
  /** Stops the daemon (sandboxes detached), the node leaving the cluster. */
  stop(): Promise<void>;
  cleanup(): Promise<void>;
}

export interface TestNodeOptions {
  pull?: PeerPull;
  machine?: ClusterNodeOptions["machine"];
  takenWaitMs?: number;
  /** Warm pool members per snapshot (default none). */
  poolSize?: number;
  /** Start no node (a test starts it). */
  noStart?: boolean;
}

export async function testNode(kv: FakeKv, id: string, o: TestNodeOptions = {}): Promise<TestNode> {
  const data = await mkdtemp(join(tmpdir(), `forkd-node-${id}-`));
  await mkdir(join(data, "snapshots"), { recursive: true });
  await mkdir(join(data, "sandboxes"), { recursive: true });
  const host = new FakeHost();
  const warnings: string[] = [];
  const log = {
    info: (m: string, f?: Record<string, unknown>) => {
      if (process.env.FORKD_TEST_NODE_LOG)
        appendFileSync(process.env.FORKD_TEST_NODE_LOG, `${id} ${m} ${JSON.stringify(f ?? {})}\n`);
    },
    warn: (m: string, f?: Record<string, unknown>) => {
      warnings.push(`${m} ${JSON.stringify(f ?? {})}`);
      if (process.env.FORKD_TEST_NODE_LOG)
        appendFileSync(process.env.FORKD_TEST_NODE_LOG, `${id} WARN ${m} ${JSON.stringify(f ?? {})}\n`);
    },
  };
  const built: { svc: SandboxService; node: ClusterNode }[] = [];
  const build = () => {
    const events = new EventBus();
    const node = new ClusterNode({
      kv,
      keys: KEYS,
      id,
      api: `http://${id}.test:7000`,
      e2b: null,
      version: "test",
      machine: o.machine ?? MACHINE,
      maxSandboxes: 100,
      dir: join(data, "cluster"),
      log,
      view: (m) => ({ tag: m.tag }),
      ...(o.pull ? { pull: o.pull } : {}),
      takenWaitMs: o.takenWaitMs ?? 200,
    });
    const store = new SnapshotStore(join(data, "snapshots"), events, node);
    const svc = new SandboxService({
      root: join(data, "sandboxes"),
      store,
      driver: host.driver(),
      log,
      strays: new FakeStrays(host, log),
      memory: host.memory,
      readyTimeoutMs: 5_000,
      events,
      cluster: node,
      ...(o.poolSize ? { poolSize: o.poolSize, pool: { max: 4 } } : {}),
    });
    const tools = new JailedTools(null, null);
    const snapshots = new SnapshotService({
      store,
      create: {
        store,
        driver: host.driver(),
        images: new ImageBuilder(data, data),
        accel: { accel: "tcg", forced: true, reason: "test", tscKhz: 1 },
        qemuVersion: "0",
        runDir: join(data, "run"),
        tools,
      },
      transfer: { store, blobs: new BlobCache(join(data, "blobs")), registry: registrySettings({}) },
      cacheDir: data,
      accel: "tcg",
      sandboxes: svc,
      log,
    });
    built.push({ svc, node });
    return { events, node, store, svc, snapshots };
  };
  const first = build();
  await fakeSnapshot(first.store, "base", null);
  const start = async (t: TestNode) => {
    await t.svc.recover();
    await t.node.start({ store: t.store, sandboxes: t.svc, snapshots: t.snapshots, events: t.events });
  };
  const t: TestNode = {
    id,
    data,
    host,
    warnings,
    ...first,
    async make(tag, m = {}) {
      const release = await t.store.claim(tag);
      const dir = await t.store.stage(`${tag}-${Math.random().toString(36).slice(2)}`);
      try {
        const f = snapshotFiles(dir);
        await writeFile(f.memory, Buffer.alloc(4096, 7));
        await writeFile(f.vmstate, m.content ?? `devices of ${tag}`);
        await writeFile(f.disk, Buffer.alloc(512, 2));
        const {
          tag: _t,
          checksum: _c,
          files: _f,
          ...rest
        } = {
          ...fakeMeta(tag, m.owner ?? null, {} as never),
          checksum: "",
        };
        const parent = m.parent ? (await t.store.get(m.parent)).meta : null;
        const meta: SealMeta = {
          ...rest,
          files: {},
          ...(parent ? { parent: { tag: parent.tag, checksum: parent.checksum } } : {}),
        };
        return await t.store.seal(dir, tag, meta);
      } finally {
        await rm(dir, { recursive: true, force: true });
        release();
      }
    },
    async restart() {
      await t.svc.detachAll();
      await t.node.close().catch(() => undefined);
      Object.assign(t, build());
      await start(t);
    },
    async stop() {
      await t.svc.detachAll();
      await t.node.close();
    },
    async cleanup() {
      for (const b of built) {
        await b.node.close().catch(() => undefined);
        await b.svc.killAll().catch(() => undefined);
      }
      await host.close();
      await rm(data, { recursive: true, force: true });
    },
  };
  if (!o.noStart) {
    try {
      await start(t);
    } catch (e) {
      await t.cleanup();
      throw e;
    }
  }
  return t;
}

/** The node's own start (for a test that made the node with noStart). */
export async function startNode(t: TestNode): Promise<void> {
  await t.svc.recover();
  await t.node.start({ store: t.store, sandboxes: t.svc, snapshots: t.snapshots, events: t.events });
}
