/** Per-caller limits with a fake clock: the token bucket refills at its rate, in-flight caps free on release. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { AuthFailureLimiter, addressKey } from "../../src/access/auth-failures.js";
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

test("failed authentications: a burst per address, then a wait until one is refilled; IPv6 counts per /64", () => {
  let now = 50;
  const fl = new AuthFailureLimiter({ rps: 0.5, burst: 3 }, 4, () => now);
  for (let i = 0; i < 3; i++) {
    assert.equal(fl.blockedFor("192.0.2.1"), 0, `failure ${i} is still allowed`);
    fl.fail("192.0.2.1");
  }
  assert.equal(fl.blockedFor("192.0.2.1"), 2, "one failure back at 0.5/s: 2 s");
  assert.equal(fl.blockedFor("::ffff:192.0.2.1"), 2, "the IPv4-mapped form is the same address");
  assert.equal(fl.blockedFor("192.0.2.2"), 0, "another address has its own bucket");
  now += 2;
  assert.equal(fl.blockedFor("192.0.2.1"), 0);
  fl.fail("192.0.2.1");
  assert.equal(fl.blockedFor("192.0.2.1"), 2);
  now += 100;
  assert.equal(fl.blockedFor("192.0.2.1"), 0, "refilled");
  assert.equal(fl.size, 0, "a full bucket is forgotten");

  for (let i = 0; i < 3; i++) fl.fail(`2001:db8:1:2::${i + 1}`);
  assert.ok(fl.blockedFor("2001:db8:1:2:ffff::9") > 0, "one /64");
  assert.equal(fl.blockedFor("2001:db8:1:3::1"), 0, "the next /64 is another");
  assert.equal(addressKey("2001:db8:1:2:3:4:5:6"), "2001:db8:1:2::/64");
  assert.equal(addressKey("::1"), "0:0:0:0::/64");
  assert.equal(addressKey("fe80::1%eth0"), "fe80:0:0:0::/64");
});

test("failed authentications: the table is bounded (least recent forgotten); rps 0 is no limit", () => {
  const fl = new AuthFailureLimiter({ rps: 1, burst: 1 }, 4, () => 0);
  for (let i = 0; i < 10; i++) fl.fail(`198.51.100.${i}`);
  assert.equal(fl.size, 4);
  assert.equal(fl.blockedFor("198.51.100.9"), 1);
  assert.equal(fl.blockedFor("198.51.100.0"), 0, "forgotten");
  const off = new AuthFailureLimiter({ rps: 0, burst: 1 });
  for (let i = 0; i < 100; i++) off.fail("192.0.2.1");
  assert.equal(off.blockedFor("192.0.2.1"), 0);
  assert.equal(off.size, 0);
});
