/**
 * The console's sealed sessions (src/access/sealed-sessions.ts): any gateway with the cluster
 * secret opens a session another made; the cookie alone opens nothing; a forged, cut, foreign or
 * expired box is refused; a ticket works once across gateways, for its own session only.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { SealedSessions } from "../../src/access/sealed-sessions.js";
import { ClusterKeys } from "../../src/cluster/keys.js";
import { UsedTickets } from "../../src/cluster/tickets.js";
import { FakeKv } from "../fakes/kv.js";

const secret = randomBytes(32);

test("a session opened on one gateway is the same session on another; its key is needed", () => {
  const a = new SealedSessions(secret);
  const b = new SealedSessions(Buffer.from(secret));
  const s = a.open("fkd_token_of_alice");
  assert.deepEqual(b.get(s.id, s.key), { token: "fkd_token_of_alice" });
  assert.equal(b.get(s.id, "wrong-key"), null);
  assert.equal(b.get(s.id, undefined), null);
  assert.equal(new SealedSessions(randomBytes(32)).get(s.id, s.key), null);
  // A box cut, changed by one character, or not one at all.
  assert.equal(b.get(s.id.slice(0, -2), s.key), null);
  const flipped = s.id.slice(0, 20) + (s.id[20] === "A" ? "B" : "A") + s.id.slice(21);
  assert.equal(b.get(flipped, s.key), null);
  assert.equal(b.get("x".repeat(5000), s.key), null);
  assert.throws(() => new SealedSessions(Buffer.alloc(16)));
});

test("a session ends at its expiry", () => {
  let now = 1_000;
  const clock = { now: () => now };
  const s = new SealedSessions(secret, clock, 60_000);
  const o = s.open("tok");
  now += 59_000;
  assert.ok(s.get(o.id, o.key));
  now += 2_000;
  assert.equal(s.get(o.id, o.key), null);
});

test("a ticket opens its session once in the whole cluster, not another session's", async () => {
  const kv = new FakeKv();
  const used = new UsedTickets(kv, new ClusterKeys("/s/"));
  const use = (t: string, exp: number) => used.use(t, exp);
  const a = new SealedSessions(secret);
  const b = new SealedSessions(secret);
  const s1 = a.open("tok1");
  const s2 = a.open("tok2");
  assert.equal(a.ticket(s1.id, "wrong"), null);
  const t = a.ticket(s1.id, s1.key);
  assert.ok(t);
  assert.equal(await b.redeemTicket(s2.id, t, use), null); // another session's cookie
  assert.deepEqual(await b.redeemTicket(s1.id, t, use), { token: "tok1" });
  assert.equal(await a.redeemTicket(s1.id, t, use), null); // used
  assert.equal(await a.redeemTicket(s1.id, s1.id, use), null); // a session box is no ticket
});

test("used tickets' marks are swept once expired", async () => {
  const kv = new FakeKv();
  const keys = new ClusterKeys("/s/");
  const used = new UsedTickets(kv, keys);
  assert.equal(await used.use("t1", 1_000), true);
  assert.equal(await used.use("t1", 1_000), false);
  assert.equal(await used.use("t2", 5_000), true);
  assert.equal(await used.sweep(2_000), 1);
  assert.equal(await kv.count(keys.consoleTickets), 1);
});
