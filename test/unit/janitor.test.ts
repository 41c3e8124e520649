/**
 * The janitor of lost sandboxes (src/cluster/janitor.ts) on a fake etcd: a node's key going
 * marks its live sandboxes lost (with a reason naming it and the time) and drops their index
 * keys, once however many gateways run it; a node back under its id keeps its sandboxes; the
 * sweep finds what nobody watched, and forgets lost records past their keep.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { ClusterKeys } from "../../src/cluster/keys.js";
import { Janitor, forgetLost } from "../../src/cluster/janitor.js";
import { SandboxLocation, parseRecord } from "../../src/cluster/records.js";
import type { SandboxState } from "../../src/cluster/records.js";
import { FakeKv } from "../fakes/kv.js";

const keys = new ClusterKeys("/t/");
const T0 = Date.parse("2025-01-01T00:00:00Z");

async function sandbox(
  kv: FakeKv,
  id: string,
  node: string,
  state: SandboxState,
  owner: string | null = "alice",
) {
  const r: SandboxLocation = {
    id,
    node,
    owner,
    tag: "app",
    state,
    reason: null,
    created: new Date(T0).toISOString(),
    updated: new Date(T0).toISOString(),
  };
  await kv.put(keys.sandbox(id), JSON.stringify(r));
  if (state === "running" || state === "paused") {
    await kv.put(keys.byNodeEntry(node, id), "");
    if (owner) await kv.put(keys.byOwnerEntry(owner, id), "");
  }
}

const read = async (kv: FakeKv, id: string) => {
  const e = await kv.get(keys.sandbox(id));
  return e ? parseRecord(SandboxLocation, e.value) : null;
};

const records = async (kv: FakeKv) =>
  (await kv.list(keys.sandboxes)).entries
    .map((e) => parseRecord(SandboxLocation, e.value))
    .filter((r): r is SandboxLocation => r !== null);

const id = (n: number) => `sb-${"a".repeat(15)}${"abcdefghijklmnop"[n]}`;

function janitor(kv: FakeKv, present: Set<string>, recs: SandboxLocation[] = [], now = T0 + 5000) {
  return new Janitor({ kv, keys, present: (n) => present.has(n), records: () => recs, now: () => now });
}

test("a gone node's running and paused sandboxes become lost with a reason; their index keys go", async () => {
  const kv = new FakeKv();
  await sandbox(kv, id(0), "n2", "running");
  await sandbox(kv, id(1), "n2", "paused", null);
  await sandbox(kv, id(2), "n2", "exited");
  await sandbox(kv, id(3), "n1", "running");
  const j = janitor(kv, new Set(["n1"]));
  assert.equal(await j.nodeGone("n2"), 2);
  const lost = await read(kv, id(0));
  assert.equal(lost?.state, "lost");
  assert.equal(lost?.reason, `node n2 stopped answering the cluster at ${new Date(T0 + 5000).toISOString()}`);
  assert.equal((await read(kv, id(1)))?.state, "lost");
  assert.equal((await read(kv, id(2)))?.state, "exited");
  assert.equal((await read(kv, id(3)))?.state, "running");
  assert.equal(await kv.count(keys.byNode("n2")), 0);
  assert.equal(await kv.count(keys.byOwner("alice")), 1); // n1's sandbox only
  assert.equal(await kv.count(keys.byNode("n1")), 1);
});

test("two gateways marking the same node mark each sandbox once", async () => {
  const kv = new FakeKv();
  for (let i = 0; i < 10; i++) await sandbox(kv, id(i), "n2", "running");
  const marked: string[] = [];
  const mk = () =>
    new Janitor({ kv, keys, present: () => false, records: () => [], onMarked: (r) => marked.push(r.id) });
  const [a, b] = await Promise.all([mk().nodeGone("n2"), mk().nodeGone("n2")]);
  assert.equal(a + b, 10);
  assert.equal(marked.length, 10);
  assert.equal(new Set(marked).size, 10);
  assert.ok((await records(kv)).every((r) => r.state === "lost"));
});

test("a node back under its id before the janitor acts keeps its sandboxes", async () => {
  const kv = new FakeKv();
  await sandbox(kv, id(0), "n2", "running");
  await kv.put(keys.node("n2"), "{}"); // it re-registered
  assert.equal(await janitor(kv, new Set()).nodeGone("n2"), 0);
  assert.equal((await read(kv, id(0)))?.state, "running");
  assert.equal(await kv.count(keys.byNode("n2")), 1);
});

test("a record changed meanwhile (the node wrote it) is not overwritten", async () => {
  const kv = new FakeKv();
  await sandbox(kv, id(0), "n2", "running");
  const j = janitor(kv, new Set());
  const e = await kv.get(keys.sandbox(id(0)));
  assert.ok(e);
  // The record moves on after the janitor's read: the transaction's compare fails.
  const origGet = kv.get.bind(kv);
  kv.get = async (k: string) => {
    const r = await origGet(k);
    if (k === keys.sandbox(id(0))) await kv.put(k, e.value.replace('"running"', '"exited"'));
    return r;
  };
  assert.equal(await j.markOne("n2", id(0), "why"), false);
  kv.get = origGet;
  assert.equal((await read(kv, id(0)))?.state, "exited");
});

test("the sweep marks sandboxes of nodes absent, drops index keys left alone, forgets old lost records and old exited ones of absent nodes", async () => {
  const kv = new FakeKv();
  await sandbox(kv, id(0), "n3", "running");
  await kv.put(keys.byNodeEntry("n4", id(1)), ""); // an index key of an absent node without a record
  const old: SandboxLocation = {
    id: id(2),
    node: "n5",
    owner: null,
    tag: "app",
    state: "lost",
    reason: "x",
    created: new Date(T0).toISOString(),
    updated: new Date(T0).toISOString(),
  };
  await kv.put(keys.sandbox(id(2)), JSON.stringify(old));
  // Exited while their node was away: the absent node's goes, the present node's is its own.
  await kv.put(keys.sandbox(id(3)), JSON.stringify({ ...old, id: id(3), state: "exited", reason: null }));
  await kv.put(
    keys.sandbox(id(4)),
    JSON.stringify({ ...old, id: id(4), node: "n1", state: "exited", reason: null }),
  );
  const now = T0 + 25 * 3_600_000;
  const j = janitor(kv, new Set(["n1"]), await records(kv), now);
  const r = await j.sweep();
  assert.deepEqual(r, { marked: 1, forgotten: 2 });
  assert.equal(await read(kv, id(3)), null);
  assert.equal((await read(kv, id(4)))?.state, "exited");
  const lost = await read(kv, id(0));
  assert.equal(lost?.state, "lost");
  assert.match(lost?.reason ?? "", /^node n3 was not in the cluster at /);
  assert.equal(await kv.count(`${keys.prefix}by-node/`), 0);
  assert.equal(await read(kv, id(2)), null);
});

test("a lost record is forgotten on request; a live one is not", async () => {
  const kv = new FakeKv();
  await sandbox(kv, id(0), "n2", "running");
  assert.equal(await forgetLost(kv, keys, id(0)), false);
  await janitor(kv, new Set()).nodeGone("n2");
  assert.equal(await forgetLost(kv, keys, id(0)), true);
  assert.equal(await read(kv, id(0)), null);
});
