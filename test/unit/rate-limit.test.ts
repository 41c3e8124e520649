/** Per-caller limits with a fake clock: the token bucket refills at its rate, in-flight caps free on release. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { RateLimiter } from "../../src/access/rate-limit.js";
import { SandboxQuota } from "../../src/access/quota.js";
import type { Caller } from "../../src/access/caller.js";

test("token bucket: burst, then refusal with the wait until one request is allowed, then refill", () => {
  let now = 100;
  const rl = new RateLimiter({ rps: 2, burst: 3, maxInflight: 0, maxHeavy: 0 }, () => now);
  const ok = () => {
    const a = rl.admit("k", false);
    if (a.ok) a.release();
    return a;
  };
  for (let i = 0; i < 3; i++) assert.equal(ok().ok, true, `burst ${i}`);
  const refused = ok();
  assert.deepEqual(refused, { ok: false, reason: "rate", retryAfterS: 1 });
  assert.equal(rl.admit("other", false).ok, true, "callers have their own buckets");
  now += 0.5; // one token back at 2/s
  assert.equal(ok().ok, true);
  assert.equal(ok().ok, false);
  now += 10; // refilled to the burst, not beyond
  for (let i = 0; i < 3; i++) assert.equal(ok().ok, true);
  assert.equal(ok().ok, false);
});

test("in-flight and heavy caps count until release; idle callers are forgotten", () => {
  const rl = new RateLimiter({ rps: 0, burst: 1, maxInflight: 3, maxHeavy: 1 }, () => 0);
  const h1 = rl.admit("k", true);
  assert.ok(h1.ok);
  const h2 = rl.admit("k", true);
  assert.deepEqual(h2, { ok: false, reason: "heavy", retryAfterS: 1 });
  const l1 = rl.admit("k", false);
  const l2 = rl.admit("k", false);
  assert.ok(l1.ok && l2.ok);
  assert.equal(rl.admit("k", false).ok, false);
  h1.release();
  h1.release(); // twice is once
  assert.equal(rl.admit("k", true).ok, true);
  assert.equal(rl.size, 1);
  const other = rl.admit("j", false);
  assert.ok(other.ok);
  other.release();
  assert.equal(rl.size, 1, "an idle caller with a full bucket is dropped");
});

test("tenant quota: held plus reserved may not pass the limit; admins and unlimited tokens pass", () => {
  const q = new SandboxQuota();
  const tenant: Caller = { name: "a", tenant: "a", tokenId: "tok-x", limited: true, maxSandboxes: 5 };
  const r1 = q.reserve(tenant, 3, () => 1);
  assert.throws(() => q.reserve(tenant, 2, () => 1), /limit of 5 sandboxes \(4 held or starting\)/);
  r1();
  assert.doesNotThrow(() => q.reserve(tenant, 2, () => 3)());
  const admin: Caller = { ...tenant, tenant: null };
  assert.doesNotThrow(() => q.reserve(admin, 1000, () => 1000));
  assert.doesNotThrow(() => q.reserve({ ...tenant, maxSandboxes: null }, 1000, () => 1000));
});
