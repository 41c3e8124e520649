/**
 * Which failed etcd calls are tried again through an election (src/etcd/retry.ts): reads, puts
 * and deletes on any election or connection answer, a transaction only on one that says it was
 * not applied; tries stop at the deadline with the last failure.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { retryable, withRetries } from "../../src/etcd/retry.js";

const grpc = (details: string) => new Error(`14 UNAVAILABLE: ${details}`);

test("an idempotent call is tried again on an election's answers; a transaction only when it was not applied", () => {
  for (const e of [
    grpc("etcdserver: leader changed"),
    grpc("etcdserver: no leader"),
    new Error("connect ECONNREFUSED"),
  ])
    assert.equal(retryable("idempotent", e), true, String(e));
  assert.equal(retryable("idempotent", new Error("etcdserver: requested lease not found")), false);
  assert.equal(retryable("txn", grpc("etcdserver: leader changed")), false, "it may have been applied");
  assert.equal(retryable("txn", grpc("etcdserver: no leader")), true, "refused before any proposal");
  assert.equal(retryable("txn", new Error("connect ECONNREFUSED 10.0.0.1:2379")), true);
});

test("tries until it succeeds; stops on a failure for good, or at the deadline with the last failure", async () => {
  let n = 0;
  const v = await withRetries("idempotent", 5_000, async () => {
    if (++n < 3) throw grpc("etcdserver: leader changed");
    return "ok";
  });
  assert.deepEqual([v, n], ["ok", 3]);

  n = 0;
  await assert.rejects(
    withRetries("txn", 5_000, async () => {
      n++;
      throw grpc("etcdserver: leader changed");
    }),
    /leader changed/,
  );
  assert.equal(n, 1, "an ambiguous transaction is not tried again");

  n = 0;
  const t0 = Date.now();
  await assert.rejects(
    withRetries("idempotent", 400, async () => {
      n++;
      throw grpc("etcdserver: no leader");
    }),
    /no leader/,
  );
  assert.ok(n >= 2 && Date.now() - t0 < 2_000, `${n} tries in ${Date.now() - t0} ms`);
});
