/**
 * The janitor of lost sandboxes (src/cluster/janitor.ts) on a fake etcd: a node's key going
 * marks its live sandboxes lost (with a reason naming it and the time) and drops their index
 * keys, once however many gateways run it; a node back under its id keeps its sandboxes; the
 * sweep finds what nobody watched, and forgets lost records past their keep.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { ClusterKeys } from "../../src/cluster/keys.js";
import { Janitor, MARK_BATCH, forgetLost } from "../../src/cluster/janitor.js";
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

/** Sandbox ids by number (any count below 26^4), distinct and valid. */
const nid = (n: number) =>
  `sb-${"a".repeat(12)}${[3, 2, 1, 0].map((p) => String.fromCharCode(97 + (Math.floor(n / 26 ** p) % 26))).join("")}`;

async function many(kv: FakeKv, n: number, node = "n2") {
  for (let i = 0; i < n; i++) await sandbox(kv, nid(i), node, "running", i % 2 ? "alice" : null);
}

test("a gone node's 1,000 sandboxes are marked in batched transactions, each once, within etcd's 128 operations", async () => {
  const kv = new FakeKv();
  await many(kv, 1000);
  const marked: string[] = [];
  const j = new Janitor({
    kv,
    keys,
    present: () => false,
    records: () => [],
    onMarked: (r) => marked.push(r.id),
  });
  const before = kv.txns;
  assert.equal(await j.nodeGone("n2"), 1000);
  assert.equal(new Set(marked).size, 1000);
  assert.equal(marked.length, 1000);
  assert.ok((await records(kv)).every((r) => r.state === "lost"));
  assert.equal(await kv.count(keys.byNode("n2")), 0);
  assert.equal(await kv.count(keys.byOwner("alice")), 0);
  // 1,000 records at up to MARK_BATCH a transaction (the fake refuses more than 128 operations).
  assert.equal(kv.txns - before, Math.ceil(1000 / MARK_BATCH));
});

for (const others of [0, 2000])
  test(`a record changed during a batch is not overwritten; the batch's others are still marked (${others ? "each read alone: the node holds few of the cluster's records" : "read in one list"})`, async () => {
    const kv = new FakeKv();
    await many(kv, 100);
    for (let i = 0; i < others; i++) await sandbox(kv, nid(1000 + i), "n1", "running");
    const gets = { n: 0 };
    const origGet = kv.get.bind(kv);
    kv.get = (key: string) => {
      if (key.startsWith(keys.sandboxes)) gets.n++;
      return origGet(key);
    };
    const changed = nid(7);
    const origTxn = kv.txn.bind(kv);
    let once = true;
    kv.txn = async (c, t, o) => {
      if (once && c.some((x) => x.key === keys.sandbox(changed))) {
        once = false; // the node wrote the record after the janitor read it
        const e = await kv.get(keys.sandbox(changed));
        assert.ok(e);
        await kv.put(e.key, e.value.replace('"running"', '"exited"'));
      }
      return origTxn(c, t, o);
    };
    const marked: string[] = [];
    const j = new Janitor({
      kv,
      keys,
      present: () => false,
      records: () => [],
      onMarked: (r) => marked.push(r.id),
    });
    assert.equal(await j.nodeGone("n2"), 99);
    assert.equal((await read(kv, changed))?.state, "exited");
    assert.equal(new Set(marked).size, 99);
    assert.ok(!marked.includes(changed));
    assert.equal((await records(kv)).filter((r) => r.state === "lost").length, 99);
    // Read in one list: only the failed batch read again, a record at a time.
    if (others === 0) assert.ok(gets.n <= 2 * MARK_BATCH, `${gets.n} gets`);
    else assert.ok(gets.n >= 100, `${gets.n} gets`);
  });

test("a node back under its id while its sandboxes are being marked keeps the ones not yet marked", async () => {
  const kv = new FakeKv();
  const n = 12 * MARK_BATCH; // full batches (they go in a random order)
  await many(kv, n);
  const origTxn = kv.txn.bind(kv);
  let batches = 0;
  kv.txn = async (c, t, o) => {
    const r = await origTxn(c, t, o);
    if (++batches === 3) await kv.put(keys.node("n2"), "{}"); // it re-registered after 3 batches
    return r;
  };
  const j = new Janitor({ kv, keys, present: () => false, records: () => [], parallel: 1 });
  const marked = await j.nodeGone("n2");
  kv.txn = origTxn;
  assert.equal(marked, 3 * MARK_BATCH);
  const all = await records(kv);
  assert.equal(all.filter((r) => r.state === "lost").length, marked);
  assert.equal(all.filter((r) => r.state === "running").length, n - marked);
  // The kept ones keep their index keys; it stopped trying once it found the node back.
  assert.equal(await kv.count(keys.byNode("n2")), n - marked);
  assert.ok(batches <= 5, `${batches} transactions`);
});

test("two gateways marking a node of 1,000 sandboxes at once mark each once", async () => {
  const kv = new FakeKv();
  await many(kv, 1000);
  const marked: string[] = [];
  const mk = () =>
    new Janitor({ kv, keys, present: () => false, records: () => [], onMarked: (r) => marked.push(r.id) });
  const [a, b] = await Promise.all([mk().nodeGone("n2"), mk().nodeGone("n2")]);
  assert.equal(a + b, 1000);
  assert.equal(marked.length, 1000);
  assert.equal(new Set(marked).size, 1000);
  assert.ok((await records(kv)).every((r) => r.state === "lost"));
  assert.equal(await kv.count(`${keys.prefix}by-node/`), 0);
});

test("the sweep forgets many old lost records in batches; one changed meanwhile stays", async () => {
  const kv = new FakeKv();
  const old = (i: number): SandboxLocation => ({
    id: nid(i),
    node: "n5",
    owner: null,
    tag: "app",
    state: "lost",
    reason: "x",
    created: new Date(T0).toISOString(),
    updated: new Date(T0).toISOString(),
  });
  for (let i = 0; i < 300; i++) await kv.put(keys.sandbox(nid(i)), JSON.stringify(old(i)));
  const recs = await records(kv);
  const kept = nid(5);
  const origTxn = kv.txn.bind(kv);
  let once = true;
  kv.txn = async (c, t, o) => {
    if (once && c.some((x) => x.key === keys.sandbox(kept))) {
      once = false; // it changed after the sweep read it (no longer lost: not to be forgotten)
      await kv.put(keys.sandbox(kept), JSON.stringify({ ...old(5), state: "running", reason: null }));
    }
    return origTxn(c, t, o);
  };
  const before = kv.txns;
  const r = await janitor(kv, new Set(), recs, T0 + 25 * 3_600_000).sweep();
  assert.deepEqual(r, { marked: 0, forgotten: 299 });
  assert.deepEqual(
    (await records(kv)).map((x) => x.id),
    [kept],
  );
  // Three batches, and the failed one's 128 a record each.
  assert.ok(kv.txns - before <= 3 + 128, `${kv.txns - before} transactions`);
});

test("a batch leaves out records the gateway's mirror shows already lost (another gateway marked them)", async () => {
  const kv = new FakeKv();
  await many(kv, 200);
  const stale = await records(kv); // what a slower gateway still holds as running
  assert.equal(await janitor(kv, new Set()).nodeGone("n2"), 200);
  const now = new Map((await records(kv)).map((r) => [r.id, r]));
  const before = kv.txns;
  const late = new Janitor({
    ...{ kv, keys, present: () => false, records: () => stale },
    record: (id) => now.get(id),
  });
  assert.equal(await late.nodeGone("n2"), 0);
  assert.equal(kv.txns, before); // nothing sent: no failed compares, no index deletes
});
