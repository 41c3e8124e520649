/**
 * Two real daemons as nodes of one cluster (one real etcd member on loopback, each node its
 * own data dir; plain loopback addresses: network namespaces are the local cluster's): both
 * register; a snapshot made on A is in the catalog and A's holdings (its tag taken on B); a
 * fork on A records where its child runs before it answers; A killed -9 leaves the cluster
 * within its lease's TTL, and restarted it re-adopts its child and reconciles (a `lost` mark
 * undone, no duplicates); A cut off from etcd (the member stopped with SIGSTOP) refuses new
 * work within the TTL and re-joins once etcd answers again. One small snapshot (TCG is slow).
 */
import assert from "node:assert/strict";
import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before } from "node:test";
import type { z } from "zod";
import { ClusterKeys } from "../../src/cluster/keys.js";
import {
  CatalogEntry,
  Holding,
  NodeRecord,
  SandboxLocation,
  parseRecord,
} from "../../src/cluster/records.js";
import { parseEndpoints } from "../../src/etcd/endpoints.js";
import { EtcdKv } from "../../src/etcd/etcd-kv.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { startEtcd } from "../helpers/etcd.js";
import type { EtcdMember } from "../helpers/etcd.js";
import { ApiError, apiRequest } from "../helpers/http.js";
import { freePort } from "../helpers/port.js";
import { steps } from "../helpers/steps.js";

const TTL_MS = 6_000;
const TAG = "c25";
const keys = new ClusterKeys(`/it-${Math.random().toString(36).slice(2, 8)}/`);
let etcd: EtcdMember;
let kv: EtcdKv;
let secretDir: string;
let a: TestDaemon;
let b: TestDaemon;
let child = "";
const { step, failed } = steps();

interface SandboxView {
  id: string;
  state: string;
  node: string | null;
}

const read = async <T>(schema: z.ZodType<T>, key: string): Promise<T | null> => {
  const e = await kv.get(key);
  return e ? parseRecord(schema, e.value) : null;
};
const until = async (what: string, ok: () => Promise<boolean>, ms: number): Promise<number> => {
  const t0 = Date.now();
  while (!(await ok())) {
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return Date.now() - t0;
};
/** The error code of a call (null: it succeeded). */
const codeOf = async (p: Promise<unknown>): Promise<string | null> =>
  p.then(
    () => null,
    (e: unknown) => (e instanceof ApiError ? e.code : `not an API error: ${String(e)}`),
  );

async function node(id: string): Promise<TestDaemon> {
  const port = await freePort();
  return makeDaemon({
    FORKD_CLUSTER: etcd.url.replace("http://", "etcd://"),
    FORKD_CLUSTER_PREFIX: keys.prefix,
    FORKD_NODE_ID: id,
    FORKD_LISTEN: `127.0.0.1:${port}`,
    FORKD_NODE_ADDR: `http://127.0.0.1:${port}`,
    FORKD_CLUSTER_SECRET_FILE: join(secretDir, "secret"),
    FORKD_POOL_SIZE: "0",
  });
}

before(async () => {
  etcd = await startEtcd();
  kv = new EtcdKv(parseEndpoints(etcd.url.replace("http://", "etcd://")));
  secretDir = await mkdtemp(join(tmpdir(), "forkd-secret-"));
  await writeFile(join(secretDir, "secret"), "s".repeat(48));
  await chmod(join(secretDir, "secret"), 0o600);
  a = await node("a");
  b = await node("b");
});

after(async () => {
  etcd?.signal("SIGCONT");
  await a?.destroy(failed());
  await b?.destroy(failed());
  await kv?.close();
  await etcd?.stop();
  await rm(secretDir, { recursive: true, force: true });
});

step("both nodes register under their leases", async () => {
  for (const [id, d] of [
    ["a", a],
    ["b", b],
  ] as const) {
    const rec = await read(NodeRecord, keys.node(id));
    assert.ok(rec, `nodes/${id}`);
    assert.equal(rec.api, d.env.FORKD_NODE_ADDR);
    assert.equal(rec.machine.accel, "tcg");
    assert.notEqual((await kv.get(keys.node(id)))?.lease, "0");
  }
});

step("a snapshot made on A is in the catalog and in A's holdings; its tag is taken on B", async () => {
  await apiRequest(a.ep, "POST", "/v1/snapshots", { tag: TAG, memory_mib: 256 }, 600_000);
  const e = await read(CatalogEntry, keys.catalogEntry(TAG));
  assert.equal(e?.origin, "a");
  assert.equal(e?.machine.accel, "tcg");
  await until(
    "A's holding",
    async () => (await read(Holding, keys.holding("a", TAG)))?.digest === e?.digest,
    10_000,
  );
  assert.equal(await kv.get(keys.holding("b", TAG)), null);
  // B: refused at once (409), before any work.
  assert.equal(
    await codeOf(apiRequest(b.ep, "POST", "/v1/snapshots", { tag: TAG, memory_mib: 256 }, 30_000)),
    "conflict",
  );
  // B's fork of it pulls it from A (its holder) first, then B holds it under the same digest.
  const onB = await apiRequest<{ sandboxes: SandboxView[] }>(
    b.ep,
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: TAG, n: 1 },
    600_000,
  );
  assert.equal(onB.sandboxes[0]?.node, "b");
  await until(
    "B's holding",
    async () => (await read(Holding, keys.holding("b", TAG)))?.digest === e?.digest,
    10_000,
  );
  await apiRequest(b.ep, "DELETE", `/v1/sandboxes/${onB.sandboxes[0]?.id ?? ""}`);
  // Its record is exited (not running, so not counted as a live sandbox); the later steps count
  // the cluster's records of running sandboxes: it goes.
  await kv.delete(keys.sandbox(onB.sandboxes[0]?.id ?? ""));
});

step("a fork on A writes where its child runs before it answers; the view names the node", async () => {
  const r = await apiRequest<{ sandboxes: SandboxView[] }>(
    a.ep,
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: TAG, n: 1 },
    300_000,
  );
  child = r.sandboxes[0]?.id ?? "";
  assert.ok(child);
  assert.equal(r.sandboxes[0]?.node, "a");
  const loc = await read(SandboxLocation, keys.sandbox(child));
  assert.equal(loc?.node, "a");
  assert.equal(loc?.state, "running");
  assert.ok(await kv.get(keys.byNodeEntry("a", child)));
});

step("A killed -9: its node key vanishes within the lease's TTL (B stays)", async () => {
  await a.kill9();
  const ms = await until(
    "nodes/a to vanish",
    async () => (await kv.get(keys.node("a"))) === null,
    TTL_MS + 3_000,
  );
  assert.ok(ms <= TTL_MS + 3_000, `${ms} ms`);
  console.log(`nodes/a vanished ${ms} ms after the kill`);
  assert.ok(await kv.get(keys.node("b")), "B is still a member");
  assert.equal(await kv.get(keys.holding("a", TAG)), null, "its holdings went with its lease");
});

step("A restarted: it re-adopts its child and reconciles (a lost mark undone), no duplicates", async () => {
  // Meanwhile a gateway marked A's sandbox lost.
  const loc = await read(SandboxLocation, keys.sandbox(child));
  assert.ok(loc);
  await kv.put(keys.sandbox(child), JSON.stringify({ ...loc, state: "lost", reason: "node a is gone" }));
  await a.start();
  assert.ok(await read(NodeRecord, keys.node("a")));
  const now = await read(SandboxLocation, keys.sandbox(child));
  assert.equal(now?.state, "running");
  assert.equal(now?.node, "a");
  assert.equal(now?.reason, null);
  assert.deepEqual(
    (await kv.list(keys.byNode("a"))).entries.map((e) => e.key),
    [keys.byNodeEntry("a", child)],
  );
  assert.equal((await kv.list(keys.sandboxes)).entries.length, 1, "one record: no duplicate");
  const sb = await apiRequest<SandboxView>(a.ep, "GET", `/v1/sandboxes/${child}`);
  assert.equal(sb.state, "running");
  assert.equal(sb.node, "a");
  const out = await apiRequest<{ stdout: string }>(a.ep, "POST", `/v1/sandboxes/${child}/exec`, {
    cmd: "echo alive",
  });
  assert.equal(out.stdout.trim(), "alive");
});

step("A cut off from etcd refuses new work within the TTL; once etcd answers it re-joins", async () => {
  // A fork of a tag no one has: 503 while cut off, else 404 (cheap: no VM is started either way).
  const probe = () =>
    codeOf(apiRequest(a.ep, "POST", "/v1/sandboxes", { snapshot_tag: "nowhere", n: 1 }, 30_000));
  assert.equal(await probe(), "not_found");
  const lease = (await kv.get(keys.node("a")))?.lease;
  etcd.signal("SIGSTOP");
  const ms = await until("A to refuse", async () => (await probe()) === "unavailable", TTL_MS + 4_000);
  assert.ok(ms <= TTL_MS + 4_000, `refused after ${ms} ms`);
  console.log(`A refused new work ${ms} ms after etcd stopped`);
  assert.equal(
    await codeOf(apiRequest(a.ep, "POST", "/v1/sandboxes", { snapshot_tag: TAG, n: 1 }, 30_000)),
    "unavailable",
  );
  // Its sandbox runs on meanwhile.
  assert.equal((await apiRequest<SandboxView>(a.ep, "GET", `/v1/sandboxes/${child}`)).state, "running");
  etcd.signal("SIGCONT");
  const back = await until("A to re-join", async () => (await probe()) === "not_found", 60_000);
  console.log(`A took new work again ${back} ms after etcd resumed`);
  assert.notEqual((await kv.get(keys.node("a")))?.lease, lease, "a new lease");
  const r = await apiRequest<{ sandboxes: SandboxView[] }>(
    a.ep,
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: TAG, n: 1 },
    300_000,
  );
  const second = r.sandboxes[0]?.id ?? "";
  assert.equal((await read(SandboxLocation, keys.sandbox(second)))?.state, "running");
  assert.equal((await read(SandboxLocation, keys.sandbox(child)))?.state, "running");
  assert.deepEqual(
    (await kv.list(keys.byNode("a"))).entries.map((e) => e.key).sort(),
    [keys.byNodeEntry("a", child), keys.byNodeEntry("a", second)].sort(),
  );
});
