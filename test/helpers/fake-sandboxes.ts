/**
 * A SandboxService over the fake VMM (test/fakes/vmm.ts) and a fake snapshot `base`: the sandbox
 * state machine without QEMU. Memory capture and strays are the fake's; no cgroups, no network.
 * restart() is a daemon restart: the service drops its connections (detachAll) and a new one,
 * with a new driver on the same host, recovers.
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { SandboxRecord } from "../../src/sandbox/sandbox.js";
import { SandboxService } from "../../src/sandbox/service.js";
import type { SandboxServiceOptions } from "../../src/sandbox/service.js";
import { SnapshotStore } from "../../src/snapshot/store.js";
import { FakeStrays } from "../fakes/strays.js";
import { FakeHost } from "../fakes/vmm.js";
import { fakeSnapshot } from "./snapshots.js";

export interface FakeSandboxes {
  data: string;
  root: string;
  store: SnapshotStore;
  host: FakeHost;
  svc: SandboxService;
  /** Warnings logged so far. */
  warnings: string[];
  restart(): Promise<SandboxService>;
  /** Sandbox directories under the root (journals left out). */
  dirs(): Promise<string[]>;
  cleanup(): Promise<void>;
}

export async function fakeSandboxes(o: Partial<SandboxServiceOptions> = {}): Promise<FakeSandboxes> {
  const data = await mkdtemp(join(tmpdir(), "forkd-fakesb-"));
  const root = join(data, "sandboxes");
  const store = new SnapshotStore(join(data, "snapshots"));
  await mkdir(store.root, { recursive: true });
  await fakeSnapshot(store, "base", null);
  const host = new FakeHost();
  const warnings: string[] = [];
  const log = { info: () => undefined, warn: (m: string) => void warnings.push(m) };
  const make = () =>
    new SandboxService({
      root,
      store,
      driver: host.driver(),
      log,
      strays: new FakeStrays(host, log),
      memory: host.memory,
      readyTimeoutMs: 5_000,
      ...o,
    });
  const services = [make()];
  const fx: FakeSandboxes = {
    data,
    root,
    store,
    host,
    svc: services[0]!,
    warnings,
    async restart() {
      await fx.svc.detachAll();
      fx.svc = make();
      services.push(fx.svc);
      return fx.svc;
    },
    async dirs() {
      return (await readdir(root)).filter((n) => n.startsWith("sb-")).sort();
    },
    async cleanup() {
      for (const s of services) await s.killAll().catch(() => undefined);
      await host.close();
      await rm(data, { recursive: true, force: true });
    },
  };
  await fx.svc.recover();
  return fx;
}

/** Waits until `cond` holds (checked every 20 ms), failing after `ms`. */
export async function until(
  what: string,
  cond: () => boolean | Promise<boolean>,
  ms = 10_000,
): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Runs `fn` with a fresh set of fake sandboxes, cleaned up afterwards whatever happens. */
export async function withSandboxes(fn: (fx: FakeSandboxes) => Promise<void>): Promise<void> {
  const fx = await fakeSandboxes();
  try {
    await fn(fx);
  } finally {
    await fx.cleanup();
  }
}

/** Forks one child of `base` (asserting it did not fail) and returns its id. */
export async function forkOne(
  fx: FakeSandboxes,
  opts: Parameters<FakeSandboxes["svc"]["fork"]>[2] = {},
): Promise<string> {
  const r = await fx.svc.fork("base", 1, opts);
  assert.deepEqual(r.failures, []);
  const id = r.sandboxes[0]?.record.id;
  assert.ok(id);
  return id;
}

/** Runs `cmd` in sandbox `id` (exit 0 asserted) and returns its stdout. */
export const sh = async (
  fx: FakeSandboxes,
  id: string,
  cmd: string,
  env?: Record<string, string>,
): Promise<string> =>
  fx.svc.use(id, async (agent) => {
    const out: Buffer[] = [];
    const r = await agent.exec({ shell: cmd, ...(env ? { env } : {}) }, { onStdout: (d) => out.push(d) })
      .result;
    assert.equal(r.exitCode, 0);
    return Buffer.concat(out).toString();
  });

/** Sandbox `id`'s record as it is on disk. */
export const readRecord = async (fx: FakeSandboxes, id: string): Promise<SandboxRecord> =>
  JSON.parse(await readFile(join(fx.root, id, "sandbox.json"), "utf8")) as SandboxRecord;
