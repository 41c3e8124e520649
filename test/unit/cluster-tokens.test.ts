/**
 * The cluster's tokens in etcd (src/cluster/cluster-tokens.ts), here on the in-memory Kv: two
 * members (a node and a gateway, say) each with a TokenStore over the same keyspace. A token
 * created through one authenticates at the other once the watch tells it; a revoke through
 * either ends what the token opened on both; what etcd holds is checked like any input.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { Authenticator, TokenStore } from "../../src/access/index.js";
import { ClusterKeys, ClusterTokens } from "../../src/cluster/index.js";
import { FakeKv } from "../fakes/kv.js";

const until = async (ok: () => boolean, ms = 2000): Promise<void> => {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 5));
  }
};

async function member(kv: FakeKv, keys: ClusterKeys, problems: string[] = []) {
  const store = new TokenStore(new ClusterTokens(kv, keys, (w) => problems.push(w)));
  await store.load();
  return { store, auth: new Authenticator(store) };
}

test("a token made through one member authenticates at another; a revoke ends it everywhere", async () => {
  const kv = new FakeKv();
  const keys = new ClusterKeys("/c1/");
  const a = await member(kv, keys);
  const b = await member(kv, keys);
  const made = await a.store.create({ tenant: "alice", scope: "tenant", maxSandboxes: 5 });
  assert.equal(a.auth.authenticate(`Bearer ${made.token}`)?.tenant, "alice", "at once where it was made");
  await until(() => b.auth.authenticate(`Bearer ${made.token}`) !== null);
  assert.equal(b.auth.authenticate(`Bearer ${made.token}`)?.maxSandboxes, 5);
  const raw = await kv.get(keys.token(made.entry.id));
  assert.ok(raw && !raw.value.includes(made.token), "etcd holds the token's hash, never the token");

  let ended = 0;
  a.store.opened.open(`token:${made.entry.id}`, () => ended++);
  await b.store.revoke(made.entry.id);
  assert.equal(b.auth.authenticate(`Bearer ${made.token}`), null);
  await until(() => a.auth.authenticate(`Bearer ${made.token}`) === null);
  assert.equal(ended, 1, "what the token opened on the other member ended");
  await assert.rejects(b.store.revoke(made.entry.id), /no token/);
});

test("what etcd holds is checked: a bad entry, one under another id's key, and two with one hash are left out", async () => {
  const kv = new FakeKv();
  const keys = new ClusterKeys();
  const problems: string[] = [];
  const seed = await member(kv, keys);
  const good = await seed.store.create({ tenant: "bob", scope: "tenant" });
  const entry = JSON.parse((await kv.get(keys.token(good.entry.id)))?.value ?? "{}") as Record<
    string,
    unknown
  >;
  await kv.put(keys.token("tok-aaaaaaaaaaaa"), "{not json");
  await kv.put(keys.token("tok-bbbbbbbbbbbb"), JSON.stringify({ ...entry, id: "tok-cccccccccccc" }));
  const other = await seed.store.create({ tenant: "carol", scope: "admin" });
  const otherEntry = JSON.parse((await kv.get(keys.token(other.entry.id)))?.value ?? "{}") as Record<
    string,
    unknown
  >;
  await kv.put(keys.token("tok-dddddddddddd"), JSON.stringify({ ...otherEntry, id: "tok-dddddddddddd" }));
  const m = await member(kv, keys, problems);
  assert.equal(m.auth.authenticate(`Bearer ${good.token}`)?.tenant, "bob");
  assert.equal(
    m.auth.authenticate(`Bearer ${other.token}`),
    null,
    "a hash claimed twice is trusted by neither",
  );
  assert.ok(problems.some((p) => p.includes("tok-aaaaaaaaaaaa")));
  assert.ok(problems.some((p) => p.includes("tok-bbbbbbbbbbbb")));
});

test("a member cut off from etcd cannot create or revoke (a clear unavailable), and keeps authenticating from memory", async () => {
  const kv = new FakeKv();
  const keys = new ClusterKeys();
  const a = await member(kv, keys);
  const made = await a.store.create({ tenant: "dan", scope: "tenant" });
  kv.cut = true;
  await assert.rejects(a.store.create({ tenant: "eve", scope: "tenant" }), /unreachable/);
  await assert.rejects(a.store.revoke(made.entry.id), /unreachable/);
  assert.equal(a.auth.authenticate(`Bearer ${made.token}`)?.tenant, "dan");
  kv.cut = false;
});
