/**
 * A forkd node in a cluster (src/cluster/node.ts), on the in-memory Kv and the fake VMM:
 * membership under a lease (one live node per id; a lost lease refuses new work until the node
 * re-joins), fencing (a write after the lease no longer holds the node's key fails, and the
 * fork it was for is refused with its children killed), the reconciliation after a restart, the
 * catalog (a node's snapshot catalogued and held; a tag another node has is a conflict before
 * the work and at the publication, nothing left behind), a delete refused while a sandbox
 * anywhere uses the snapshot and every node's copy removed once it goes, and a fork of a
 * snapshot another node holds fetched once however many forks wait.
 */
import assert from "node:assert/strict";
import { readdir } from "node:fs/promises";
import { test } from "node:test";
import type { z } from "zod";
import { chunkGroups } from "../../src/cluster/fence.js";
import type { Holder } from "../../src/cluster/ensure.js";
import {
  CatalogEntry,
  Holding,
  NodeRecord,
  SandboxLocation,
  parseRecord,
} from "../../src/cluster/records.js";
import type { KvOp } from "../../src/etcd/kv.js";
import { ForkdError } from "../../src/util/errors.js";
import { FakeKv } from "../fakes/kv.js";
import { KEYS, testNode } from "../helpers/cluster-node.js";
import type { TestNode } from "../helpers/cluster-node.js";
import { until } from "../helpers/fake-sandboxes.js";

const get = async <T>(kv: FakeKv, schema: z.ZodType<T>, key: string): Promise<T | null> => {
  const e = await kv.get(key);
  return e ? parseRecord(schema, e.value) : null;
};
const nodeRec = (kv: FakeKv, id: string) => get(kv, NodeRecord, KEYS.node(id));
const catalog = (kv: FakeKv, key: string) => get(kv, CatalogEntry, KEYS.catalogEntry(key));
const holding = (kv: FakeKv, node: string, key: string) => get(kv, Holding, KEYS.holding(node, key));
const location = (kv: FakeKv, id: string) => get(kv, SandboxLocation, KEYS.sandbox(id));
const isCode = (code: string, text?: RegExp) => (e: unknown) =>
  e instanceof ForkdError && e.code === code && (text === undefined || text.test(e.message));

async function withNodes(ids: string[], fn: (kv: FakeKv, nodes: TestNode[]) => Promise<void>): Promise<void> {
  const kv = new FakeKv();
  const nodes: TestNode[] = [];
  try {
    for (const id of ids) nodes.push(await testNode(kv, id));
    await fn(kv, nodes);
  } finally {
    for (const n of nodes) await n.cleanup();
  }
}

test("a node registers under its lease: addresses, version, machine, capacity; its load follows its sandboxes", async () => {
  await withNodes(["a"], async (kv, [a]) => {
    const rec = await nodeRec(kv, "a");
    assert.ok(rec);
    assert.equal(rec.api, "http://a.test:7000");
    assert.deepEqual(rec.machine, { accel: "tcg", qemu: "0", cpu: "qemu64" });
    assert.equal(rec.capacity.maxSandboxes, 100);
    assert.equal(rec.capacity.running, 0);
    const raw = await kv.get(KEYS.node("a"));
    assert.equal(raw?.lease, a!.node.member.lease?.id, "under the node's lease");
    await a!.svc.fork("base", 2);
    await until("the record to count them", async () => (await nodeRec(kv, "a"))?.capacity.running === 2);
    // base (there before the node joined) is catalogued as this node's, and held.
    const base = await catalog(kv, "base");
    assert.equal(base?.origin, "a");
    assert.equal((await holding(kv, "a", "base"))?.digest, base?.digest);
  });
});

test("holdings carry the warm pool's ready members, from its events", async () => {
  const kv = new FakeKv();
  const a = await testNode(kv, "a", { poolSize: 1 });
  try {
    assert.equal((await holding(kv, "a", "base"))?.warm, 0);
    a.svc.prewarm("base");
    await until("a warm member told", async () => (await holding(kv, "a", "base"))?.warm === 1, 15_000);
    await a.svc.forgetSnapshot("base");
    await until("its member gone", async () => (await holding(kv, "a", "base"))?.warm === 0, 15_000);
  } finally {
    await a.cleanup();
  }
});

test("a second node with a live node's id refuses to start", async () => {
  const kv = new FakeKv();
  const a = await testNode(kv, "same");
  try {
    await assert.rejects(testNode(kv, "same"), isCode("conflict", /held by a live node/));
    // The live one is untouched.
    assert.equal((await kv.get(KEYS.node("same")))?.lease, a.node.member.lease?.id);
  } finally {
    await a.cleanup();
  }
});

test("a lost lease: no new work (503) until the node re-joins under a new lease, holdings written again", async () => {
  await withNodes(["a"], async (kv, [a]) => {
    const first = a!.node.member.lease?.id;
    assert.ok(first);
    assert.ok(await holding(kv, "a", "base"));
    kv.cut = true; // etcd unreachable: the re-join cannot happen yet
    kv.expireLease(first);
    assert.equal(a!.node.member.admitted, false);
    await assert.rejects(a!.svc.fork("base", 1), isCode("unavailable", /cut off from the cluster/));
    await assert.rejects(a!.make("new"), isCode("unavailable", /cut off/));
    assert.equal(a!.svc.list().length, 0, "no child started");
    kv.cut = false;
    await until("the node to re-join", () => a!.node.member.admitted, 15_000);
    assert.notEqual(a!.node.member.lease?.id, first);
    await until("its holdings again", async () => (await holding(kv, "a", "base")) !== null);
    const r = await a!.svc.fork("base", 1);
    assert.equal(r.sandboxes.length, 1);
  });
});

test("fencing: a write after the lease no longer holds the node's key fails, and the fork is refused with its children killed", async () => {
  await withNodes(["a"], async (kv, [a]) => {
    const ok = await a!.svc.fork("base", 1);
    const kept = ok.sandboxes[0]!.record.id;
    assert.equal((await location(kv, kept))?.state, "running");
    // etcd gave the node's key to another lease (the node has not heard yet).
    const other = await kv.grantLease(6);
    await kv.put(KEYS.node("a"), (await kv.get(KEYS.node("a")))!.value, other.id);
    const before = a!.host.processes().length;
    await assert.rejects(a!.svc.fork("base", 3), isCode("unavailable", /node cut off from the cluster/));
    assert.deepEqual(
      a!.svc.list().map((s) => s.record.id),
      [kept],
      "the refused fork's children are killed",
    );
    await until("their VMMs to end", () => a!.host.processes().length <= before);
    const { entries } = await kv.list(KEYS.sandboxes);
    assert.deepEqual(
      entries.map((e) => e.key),
      [KEYS.sandbox(kept)],
      "nothing recorded for the refused children",
    );
    // etcd unreachable: the same.
    await kv.put(KEYS.node("a"), (await kv.get(KEYS.node("a")))!.value, a!.node.member.lease!.id);
    kv.cut = true;
    await assert.rejects(a!.svc.fork("base", 1), isCode("unavailable", /cut off/));
    kv.cut = false;
    assert.equal(a!.svc.list().length, 1);
  });
});

test("locations: a fork's children, their pauses, resumes and exits, and their removal, as they happen", async () => {
  await withNodes(["a"], async (kv, [a]) => {
    const r = await a!.svc.fork("base", 2, { owner: "alice" });
    const [x, y] = r.sandboxes.map((s) => s.record.id) as [string, string];
    for (const id of [x, y]) {
      const l = await location(kv, id);
      assert.equal(l?.node, "a");
      assert.equal(l?.state, "running");
      assert.equal(l?.owner, "alice");
      assert.ok(await kv.get(KEYS.byNodeEntry("a", id)));
      assert.ok(await kv.get(KEYS.byOwnerEntry("alice", id)));
    }
    await a!.svc.pause(x);
    await until("paused written", async () => (await location(kv, x))?.state === "paused");
    await a!.svc.resume(x);
    await until("running written", async () => (await location(kv, x))?.state === "running");
    await a!.host.process(a!.svc.get(y).record.pid)?.crash();
    await until("exited written", async () => (await location(kv, y))?.state === "exited");
    assert.equal((await location(kv, y))?.reason, "vmm process exited");
    assert.equal(await kv.get(KEYS.byNodeEntry("a", y)), null, "an exited sandbox leaves the indexes");
    assert.equal(await kv.get(KEYS.byOwnerEntry("alice", y)), null);
    await a!.svc.kill(x);
    await until("a killed one removed", async () => (await kv.get(KEYS.sandbox(x))) === null);
    assert.equal(await kv.get(KEYS.byNodeEntry("a", x)), null);
  });
});

test("a restart reconciles: survivors running on this node (a lost mark undone), the gone ones exited, no duplicates", async () => {
  await withNodes(["a"], async (kv, [a]) => {
    const r = await a!.svc.fork("base", 3);
    const [live, paused, dies] = r.sandboxes.map((s) => s.record.id) as [string, string, string];
    await a!.svc.pause(paused);
    await until("paused written", async () => (await location(kv, paused))?.state === "paused");
    const diesPid = a!.svc.get(dies).record.pid;
    // While the node is down: a gateway marks its sandboxes lost; one VMM dies.
    await a!.stop();
    assert.equal(await kv.get(KEYS.node("a")), null, "the node's key went with its lease");
    for (const id of [live, paused, dies]) {
      const l = (await location(kv, id))!;
      await kv.put(KEYS.sandbox(id), JSON.stringify({ ...l, state: "lost", reason: "node a is gone" }));
    }
    await a!.host.process(diesPid)?.crash();
    await a!.restart();
    assert.equal((await location(kv, live))?.state, "running");
    assert.equal((await location(kv, live))?.node, "a");
    assert.equal((await location(kv, live))?.reason, null);
    assert.equal((await location(kv, paused))?.state, "paused");
    const gone = await location(kv, dies);
    assert.equal(gone?.state, "exited");
    assert.match(gone?.reason ?? "", /not on node a when it re-joined/);
    const { entries } = await kv.list(KEYS.byNode("a"));
    assert.deepEqual(
      entries.map((e) => e.key).sort(),
      [KEYS.byNodeEntry("a", live), KEYS.byNodeEntry("a", paused)].sort(),
    );
    assert.equal((await kv.list(KEYS.sandboxes)).entries.length, 3, "one record per sandbox");
    assert.equal(a!.node.member.admitted, true);
  });
});

test("catalog: a snapshot made here is catalogued (digest, origin, machine) and held once made; its tag is the cluster's", async () => {
  await withNodes(["a", "b"], async (kv, [a, b]) => {
    await a!.make("app");
    const e = await catalog(kv, "app");
    assert.equal(e?.origin, "a");
    assert.deepEqual(e?.machine, { accel: "tcg", qemu: "0", cpu: "qemu64" });
    assert.ok((e?.bytes ?? 0) >= 4096);
    // Held as soon as its creation answered (a gateway reading it right after finds it here).
    assert.equal((await holding(kv, "a", "app"))?.digest, e?.digest);
    // A branch names its parent; its digest is over the parent's.
    await a!.make("app-br", { parent: "app" });
    assert.equal((await catalog(kv, "app-br"))?.parent, "app");
    // B: the tag is taken before any work (namespaces and the claim), nothing left behind.
    await until(
      "b's mirror",
      () => b!.snapshots.namespaces !== undefined && b!.node.lookup("app") !== undefined,
    );
    await assert.rejects(b!.snapshots.namespaces.forNew(null, "app"), isCode("conflict"));
    await assert.rejects(
      b!.make("app"),
      isCode("conflict", /already exists in the cluster \(made on node a\)/),
    );
    assert.deepEqual((await readdir(b!.store.root)).sort(), ["base"]);
    assert.equal((await catalog(kv, "app"))?.origin, "a", "A's entry untouched");
  });
});

test("catalog: a tag another node publishes while this one builds it is a conflict at the publication, nothing left behind", async () => {
  await withNodes(["a", "b"], async (kv, [a, b]) => {
    await a!.make("race", { content: "A's" });
    // B's own view had not caught up: it claims, works, and fails at the publication.
    const lookup = b!.node.lookup.bind(b!.node);
    b!.node.lookup = () => undefined;
    const claim = b!.node.claim.bind(b!.node);
    b!.node.claim = async () => undefined;
    try {
      await assert.rejects(b!.make("race", { content: "B's" }), isCode("conflict", /made on node a/));
    } finally {
      b!.node.lookup = lookup;
      b!.node.claim = claim;
    }
    assert.deepEqual((await readdir(b!.store.root)).sort(), ["base"], "nothing published, no staging left");
    assert.equal(await b!.store.has("race"), false);
    assert.equal((await catalog(kv, "race"))?.origin, "a");
    assert.equal(await holding(kv, "b", "race"), null);
  });
});

test("a delete is refused while a sandbox anywhere runs from it (naming it), then goes cluster-wide", async () => {
  await withNodes(["a", "b"], async (kv, [a]) => {
    await a!.make("app");
    const elsewhere = "sb-aaaaaaaaaaaaaaaa";
    const loc: SandboxLocation = {
      id: elsewhere,
      node: "b",
      owner: null,
      tag: "app",
      state: "running",
      reason: null,
      created: new Date().toISOString(),
      updated: new Date().toISOString(),
    };
    await kv.put(KEYS.sandbox(elsewhere), JSON.stringify(loc));
    await assert.rejects(
      a!.snapshots.delete("app", { cascade: false, force: false }),
      (e: unknown) =>
        isCode("conflict", /in use in the cluster/)(e) && (e as ForkdError).message.includes(elsewhere),
    );
    assert.ok(await catalog(kv, "app"), "still catalogued");
    assert.equal(await a!.store.has("app"), true, "and still here");
    await kv.put(KEYS.sandbox(elsewhere), JSON.stringify({ ...loc, state: "exited", reason: "killed" }));
    // A branch another node made stacks on it: refused without cascade, naming it.
    const app = (await catalog(kv, "app"))!;
    await kv.put(
      KEYS.catalogEntry("app-b"),
      JSON.stringify({ ...app, key: "app-b", parent: "app", origin: "b" }),
    );
    await until("a's view of it", () => a!.node.lookup("app-b") !== undefined);
    await assert.rejects(
      a!.snapshots.delete("app", { cascade: false, force: false }),
      isCode("conflict", /dependents \(branches stacked on it\): app-b/),
    );
    assert.equal(await a!.store.has("app"), true);
    await kv.delete(KEYS.catalogEntry("app-b"));
    await until("a's view of its end", () => a!.node.lookup("app-b") === undefined);
    await a!.snapshots.delete("app", { cascade: false, force: false });
    assert.equal(await catalog(kv, "app"), null);
    assert.equal(await a!.store.has("app"), false);
    await until("its holding gone", async () => (await holding(kv, "a", "app")) === null);
  });
});

test("a node follows no other node's record (N nodes watching N records was N² events): it reads nodes/ when a pull needs holders", async () => {
  const kv = new FakeKv();
  const nodes: TestNode[] = [];
  const seen: Holder[][] = [];
  try {
    for (const id of ["a", "b"]) nodes.push(await testNode(kv, id));
    const c = await testNode(kv, "c", {
      pull: async (_key, holders) => {
        seen.push(await holders());
        throw new ForkdError("unavailable", "no transfer in this test");
      },
    });
    nodes.push(c);
    const watched = kv.watching();
    assert.ok(watched.length > 0, "it follows the catalog");
    for (const id of ["a", "b", "c"])
      assert.ok(
        !watched.some((p) => KEYS.node(id).startsWith(p)),
        `no watch covers nodes/${id}: ${watched.join(", ")}`,
      );
    // Holders come from nodes/ as it is when the pull asks: a node that left is not one.
    await nodes[0]!.make("app");
    await until(
      "c's view",
      async () => c.node.lookup("app") !== undefined && (await holding(kv, "a", "app")) !== null,
    );
    await assert.rejects(c.svc.fork("app", 1), /no transfer/);
    assert.deepEqual(seen[0], [{ node: "a", url: "http://a.test:7000" }]);
    await nodes[0]!.stop();
    await assert.rejects(c.svc.fork("app", 1), /no transfer/);
    assert.deepEqual(seen[1], [], "a left: no holder");
  } finally {
    for (const n of nodes) await n.cleanup();
  }
});

test("a copy fetched from a peer: once for many forks, held under the catalog's digest, removed when the cluster deletes it", async () => {
  const kv = new FakeKv();
  const pulls: { key: string; holders: Holder[] }[] = [];
  const nodes: TestNode[] = [];
  try {
    const a = await testNode(kv, "a");
    nodes.push(a);
    // B's peer transfer: copies A's files (its disk "rebased": other sums), sealed as a copy.
    const b = await testNode(kv, "b", {
      pull: async (key, holders) => {
        pulls.push({ key, holders: await holders() });
        await new Promise((r) => setTimeout(r, 50));
        await b.make(key, { content: "rebased here" });
      },
    });
    nodes.push(b);
    await a.make("app");
    const e = await catalog(kv, "app");
    await until(
      "b's view",
      async () => b.node.lookup("app") !== undefined && (await holding(kv, "a", "app")) !== null,
    );
    const forks = await Promise.all([1, 2, 3].map(() => b.svc.fork("app", 1)));
    assert.equal(forks.flatMap((f) => f.sandboxes).length, 3);
    assert.equal(pulls.length, 1, "fetched once");
    assert.deepEqual(pulls[0]?.holders, [{ node: "a", url: "http://a.test:7000" }]);
    await until("b's holding", async () => (await holding(kv, "b", "app"))?.digest === e?.digest);
    assert.equal((await catalog(kv, "app"))?.origin, "a", "a copy writes no catalog entry");
    // The delete (on A) is refused while B's children run; then B removes its copy.
    await assert.rejects(
      a.snapshots.delete("app", { cascade: false, force: false }),
      isCode("conflict", /in use/),
    );
    for (const f of forks) await b.svc.kill(f.sandboxes[0]!.record.id);
    await until("b's locations removed", async () => (await kv.list(KEYS.sandboxes)).entries.length === 0);
    await a.snapshots.delete("app", { cascade: false, force: false });
    await until("b's copy removed", async () => !(await b.store.has("app")));
    await until("b's holding removed", async () => (await holding(kv, "b", "app")) === null);
  } finally {
    for (const n of nodes) await n.cleanup();
  }
});

test("a fork of a snapshot held elsewhere: 503 until the peer transfer exists; another machine's: 409", async () => {
  const kv = new FakeKv();
  const nodes: TestNode[] = [];
  try {
    const a = await testNode(kv, "a");
    nodes.push(a);
    const b = await testNode(kv, "b");
    nodes.push(b);
    const c = await testNode(kv, "c", { machine: { accel: "kvm", qemu: "9", cpu: "host" } });
    nodes.push(c);
    await a.make("app");
    await until(
      "their views",
      () => b.node.lookup("app") !== undefined && c.node.lookup("app") !== undefined,
    );
    await assert.rejects(b.svc.fork("app", 1), isCode("unavailable", /peer transfer not available/));
    await assert.rejects(c.svc.fork("app", 1), isCode("conflict", /restores only on a machine like/));
  } finally {
    for (const n of nodes) await n.cleanup();
  }
});

test("a node's copies of what the cluster deleted while it was away are removed when it returns", async () => {
  await withNodes(["a", "b"], async (kv, [a, b]) => {
    // B made "gone" and holds it; while B is down, A deletes it cluster-wide.
    await b!.make("gone");
    await until("a's view", () => a!.node.lookup("gone") !== undefined);
    await b!.stop();
    await a!.snapshots.delete("gone", { cascade: false, force: false });
    assert.equal(await catalog(kv, "gone"), null);
    await b!.restart();
    await until("b's copy removed", async () => !(await b!.store.has("gone")), 15_000);
  });
});

test("fence: groups pack into transactions of at most 128 ops, never split", () => {
  const g = (n: number): KvOp[] => Array.from({ length: n }, (_, i) => ({ type: "delete", key: `k${i}` }));
  const chunks = chunkGroups(Array.from({ length: 100 }, () => g(3)));
  assert.ok(chunks.every((c) => c.length <= 128 && c.length % 3 === 0));
  assert.equal(
    chunks.reduce((a, c) => a + c.length, 0),
    300,
  );
  assert.equal(chunks.length, 3);
  assert.throws(() => chunkGroups([g(129)]));
});
