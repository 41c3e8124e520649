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
import type { Kv, KvWatchEvent } from "../../src/etcd/index.js";
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

/** `kv` whose watches tell each event `lagMs` late (a member whose watch is behind), counting lists. */
function lagging(kv: FakeKv, lagMs: number): { kv: Kv; lists: () => number } {
  let lists = 0;
  const k = Object.create(kv) as Kv;
  Object.assign(k, {
    list: (prefix: string, limit?: number) => {
      lists++;
      return kv.list(prefix, limit);
    },
    watch: (prefix: string, from: number, onEvent: (e: KvWatchEvent) => void, onError: (e: Error) => void) =>
      kv.watch(prefix, from, (e) => void setTimeout(() => onEvent(e), lagMs), onError),
  });
  return { kv: k, lists: () => lists };
}

test("a token made a moment ago through another member works at once: an unknown bearer makes a member catch up", async () => {
  const kv = new FakeKv();
  const keys = new ClusterKeys("/c3/");
  const a = await member(kv, keys);
  const slow = lagging(kv, 400);
  const bStore = new TokenStore(new ClusterTokens(slow.kv, keys));
  await bStore.load();
  const b = { store: bStore, auth: new Authenticator(bStore) };
  const made = await a.store.create({ tenant: "alice", scope: "tenant" });
  const header = `Bearer ${made.token}`;
  assert.equal(b.auth.authenticate(header), null, "b's watch has not told it yet");
  await b.auth.fresh(header);
  assert.equal(b.auth.authenticate(header)?.tenant, "alice");
  // A known bearer, or none, reads nothing of etcd; unknown ones share few catch-ups.
  const before = slow.lists();
  await b.auth.fresh(header);
  await b.auth.fresh(undefined);
  assert.equal(slow.lists(), before);
  await Promise.all(Array.from({ length: 50 }, (_, i) => b.auth.fresh(`Bearer fkd_unknown${i}`)));
  assert.ok(slow.lists() - before <= 2, `${slow.lists() - before} catch-ups for 50 unknown bearers`);
  assert.equal(b.auth.authenticate("Bearer fkd_unknown1"), null);
});

test("a creation etcd answered ambiguously (an election) is tried again, and its own write found is no conflict", async () => {
  const kv = new FakeKv();
  const keys = new ClusterKeys("/c4/");
  const a = await member(kv, keys);
  // The first transaction is applied, and its answer lost ("leader changed").
  const txn = kv.txn.bind(kv);
  let calls = 0;
  kv.txn = async (...args: Parameters<FakeKv["txn"]>) => {
    const r = await txn(...args);
    if (++calls === 1) throw new Error("etcd: txn: 14 UNAVAILABLE: etcdserver: leader changed");
    return r;
  };
  const made = await a.store.create({ tenant: "alice", scope: "tenant" });
  assert.equal(calls, 2);
  assert.equal(a.auth.authenticate(`Bearer ${made.token}`)?.tenant, "alice");
  kv.txn = txn;
  // Another token's entry under the same id is a conflict still.
  const other = { ...made.entry, sha256: "0".repeat(64) };
  await assert.rejects(a.store.backing.add(other, []), /exists already/);
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
