/**
 * A fork's fetch of a snapshot this node lacks (src/cluster/ensure.ts), on the in-memory Kv with
 * node:test's mocked clock (setTimeout and Date: the 10 s are ticked, not slept): a snapshot just
 * made is in the catalog a moment before its origin writes its holding, so the peer fetch's
 * holders wait for it (asking every 250 ms) while the origin is live, up to 10 s, then answer
 * with none; an origin that is not live, or is this node, is not waited for; a holder under
 * another digest is none; forks that wait together fetch once.
 */
import { afterEach, beforeEach, mock, test } from "node:test";
import assert from "node:assert/strict";
import type { CatalogGuard } from "../../src/cluster/catalog.js";
import type { NodeContext } from "../../src/cluster/context.js";
import { SnapshotFetch } from "../../src/cluster/ensure.js";
import type { Holder } from "../../src/cluster/ensure.js";
import { ClusterKeys } from "../../src/cluster/keys.js";
import type { CatalogEntry, Holding, NodeRecord } from "../../src/cluster/records.js";
import { FakeKv } from "../fakes/kv.js";

const KEYS = new ClusterKeys("/t/");
const MACHINE = { accel: "tcg" as const, qemu: "0", cpu: "qemu64" };
const DIGEST = "d".repeat(64);
const STEP_MS = 250;
const WAIT_MS = 10_000;

const entry = (key: string, origin: string): CatalogEntry => ({
  key,
  owner: null,
  parent: null,
  digest: DIGEST,
  origin,
  created: new Date(0).toISOString(),
  machine: MACHINE,
  bytes: 1,
  view: {},
});

const nodeRecord = (id: string): NodeRecord => ({
  id,
  api: `http://${id}.test:7000`,
  e2b: null,
  version: "test",
  started: new Date(0).toISOString(),
  lease: "1",
  machine: MACHINE,
  capacity: { cores: 2, memoryMiB: 4096, maxSandboxes: 10, running: 0, paused: 0, freeMemoryMiB: 2048 },
  draining: false,
  updated: new Date(0).toISOString(),
});

/** Node `self`'s fetch, the catalog holding `entries`, the cluster's live nodes `live` (their nodes/ records). */
async function fetcher(
  kv: FakeKv,
  o: {
    self: string;
    live: string[];
    entries: CatalogEntry[];
    pull?: (key: string, h: () => Promise<Holder[]>) => Promise<void>;
  },
): Promise<SnapshotFetch> {
  for (const id of o.live) await kv.put(KEYS.node(id), JSON.stringify(nodeRecord(id)));
  const catalog = new Map(o.entries.map((e) => [e.key, e]));
  const ctx = {
    kv,
    keys: KEYS,
    id: o.self,
    log: { info: () => undefined, warn: () => undefined },
    machine: MACHINE,
    store: { has: async () => false, pending: async () => undefined },
  } as unknown as NodeContext;
  const guard = {
    entry: (key: string) => catalog.get(key),
    expectCopy: () => undefined,
    copyDone: () => undefined,
  } as unknown as CatalogGuard;
  return new SnapshotFetch(ctx, guard, o.pull ?? (async () => undefined));
}

const hold = (kv: FakeKv, node: string, key: string, digest = DIGEST) =>
  kv.put(KEYS.holding(node, key), JSON.stringify({ key, digest, warm: 0 } satisfies Holding));

/** Lets every promise the clock's last tick released run (setImmediate is not mocked). */
const settle = () => new Promise((r) => setImmediate(r));

/** Ticks the mocked clock `ms` forward one step at a time, settling after each. */
async function advance(ms: number): Promise<void> {
  for (let t = 0; t < ms; t += STEP_MS) {
    mock.timers.tick(STEP_MS);
    await settle();
  }
}

/** A promise's state without waiting for it. */
function track<T>(p: Promise<T>): { done: boolean; value: T | undefined } {
  const s: { done: boolean; value: T | undefined } = { done: false, value: undefined };
  void p.then((v) => {
    s.done = true;
    s.value = v;
  });
  return s;
}

beforeEach(() => mock.timers.enable({ apis: ["setTimeout", "Date"], now: 1_000_000 }));
afterEach(() => mock.timers.reset());

test("a peer fetch waits for the live origin's holding to show, then fetches from it, once for every waiting fork", async () => {
  const kv = new FakeKv();
  const asked: Holder[][] = [];
  const f = await fetcher(kv, {
    self: "b",
    live: ["a", "b"],
    entries: [entry("app", "a")],
    pull: async (_key, holders) => void asked.push(await holders()),
  });
  const forks = track(Promise.all([f.ensure("app"), f.ensure("app"), f.ensure("app")]));
  await settle();
  await advance(3_000);
  assert.equal(forks.done, false, "still waiting for a's holding after 3 s");
  await hold(kv, "a", "app");
  await advance(STEP_MS);
  await settle();
  assert.equal(forks.done, true, "the next ask found it");
  assert.deepEqual(asked, [[{ node: "a", url: "http://a.test:7000" }]], "one fetch, from the origin");
});

test("the wait is bounded: after 10 s with no holding, no holders (the pull has none to ask)", async () => {
  const kv = new FakeKv();
  const f = await fetcher(kv, { self: "b", live: ["a", "b", "c"], entries: [entry("app", "a")] });
  // A copy under another digest (an older snapshot of the tag) is no holder.
  await hold(kv, "c", "app", "e".repeat(64));
  const got = track(f.holders("app"));
  await settle();
  await advance(WAIT_MS - STEP_MS);
  assert.equal(got.done, false, "still waiting just before 10 s");
  await advance(2 * STEP_MS);
  await settle();
  assert.equal(got.done, true, "answered once 10 s passed");
  assert.deepEqual(got.value, []);
});

test("no wait when the origin is not live, or is this node; holders found at once are answered at once", async () => {
  const f1 = await fetcher(new FakeKv(), { self: "b", live: ["b"], entries: [entry("app", "a")] });
  const gone = track(f1.holders("app"));
  const f2 = await fetcher(new FakeKv(), { self: "a", live: ["a", "b"], entries: [entry("app", "a")] });
  const self = track(f2.holders("app"));
  await settle();
  await settle();
  assert.deepEqual([gone.done, gone.value], [true, []], "its origin left: nothing to wait for");
  assert.deepEqual([self.done, self.value], [true, []], "made here: nobody else will show it");
  // Held by the origin and another node: both, the origin first, with no tick of the clock.
  const kv = new FakeKv();
  await hold(kv, "a", "app");
  await hold(kv, "c", "app");
  const f3 = await fetcher(kv, { self: "b", live: ["a", "b", "c"], entries: [entry("app", "a")] });
  const both = track(f3.holders("app"));
  await settle();
  await settle();
  assert.deepEqual(both.value, [
    { node: "a", url: "http://a.test:7000" },
    { node: "c", url: "http://c.test:7000" },
  ]);
});
