/**
 * The tenant quota across the cluster (src/cluster/quota.ts) on a fake etcd: held (by-owner/)
 * plus reserved never passes max_sandboxes, however many gateways admit at once; a reservation
 * goes with release() or with its gateway's lease; admins and tenants without a limit reserve
 * nothing.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { ClusterKeys } from "../../src/cluster/keys.js";
import { ClusterQuota } from "../../src/cluster/quota.js";
import type { KvLease } from "../../src/etcd/kv.js";
import { ForkdError } from "../../src/util/errors.js";
import { FakeKv } from "../fakes/kv.js";

const keys = new ClusterKeys("/q/");

function gatewayQuota(kv: FakeKv): { quota: ClusterQuota; lease: Promise<KvLease> } {
  const lease = kv.grantLease(10);
  return { quota: new ClusterQuota({ kv, keys, lease: () => lease }), lease };
}

test("reservations and held sandboxes count against the limit; a refusal says what is held", async () => {
  const kv = new FakeKv();
  const { quota } = gatewayQuota(kv);
  await kv.put(keys.byOwnerEntry("alice", "sb-aaaaaaaaaaaaaaaa"), "");
  const r = await quota.reserve("alice", 5, 3);
  assert.deepEqual(await quota.usage("alice").then((u) => [u.held, u.reserved]), [1, 3]);
  await assert.rejects(quota.reserve("alice", 5, 2), (e: unknown) => {
    assert.ok(e instanceof ForkdError);
    assert.equal(e.code, "resource_exhausted");
    assert.deepEqual(e.details, { limit: 5, existing: 4 });
    return true;
  });
  await r.release();
  await r.release(); // idempotent
  assert.equal((await quota.usage("alice")).reserved, 0);
  await (await quota.reserve("alice", 5, 4)).release();
});

test("concurrent admissions through several gateways never pass the limit together", async () => {
  const kv = new FakeKv();
  const gateways = [gatewayQuota(kv), gatewayQuota(kv), gatewayQuota(kv)];
  const tries = Array.from({ length: 30 }, (_, i) => gateways[i % 3]!.quota.reserve("bob", 10, 1));
  const settled = await Promise.allSettled(tries);
  const ok = settled.filter((s) => s.status === "fulfilled").length;
  assert.equal(ok, 10);
  for (const s of settled)
    if (s.status === "rejected") assert.equal((s.reason as ForkdError).code, "resource_exhausted");
  assert.equal((await gateways[0]!.quota.usage("bob")).reserved, 10);
});

test("a gateway's reservations go with its lease", async () => {
  const kv = new FakeKv();
  const { quota, lease } = gatewayQuota(kv);
  await quota.reserve("carol", 2, 2);
  await assert.rejects(quota.reserve("carol", 2, 1));
  kv.expireLease((await lease).id);
  assert.equal((await quota.usage("carol")).reserved, 0);
  const other = gatewayQuota(kv);
  await other.quota.reserve("carol", 2, 1);
});

test("an admin, or a tenant without a limit, reserves nothing", async () => {
  const kv = new FakeKv();
  const { quota } = gatewayQuota(kv);
  await (await quota.reserve(null, 1, 100)).release();
  await (await quota.reserve("dave", null, 100)).release();
  assert.equal(await kv.count(`${keys.prefix}reservations/`), 0);
});
