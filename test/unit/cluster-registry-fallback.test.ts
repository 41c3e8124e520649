/**
 * A fork's fetch of a snapshot no live peer gives (src/cluster/ensure.ts with pushes.ts), on the
 * in-memory Kv: a node that pushed a snapshot records the push (reference, manifest digest, its
 * chain's digests as it held them); a node that finds no peer holding the snapshot pulls it
 * from the newest recorded push whose chain is still the catalog's, under the catalog's keys
 * and owners, once for every fork waiting; a stale push (the tag made again since, an ancestor
 * changed) is never used; a failed push moves to the next; a peer that gives it keeps the
 * registry out; a delete of the snapshot removes its records.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { CatalogGuard } from "../../src/cluster/catalog.js";
import type { NodeContext } from "../../src/cluster/context.js";
import { deleteInCluster } from "../../src/cluster/deleting.js";
import { SnapshotFetch } from "../../src/cluster/ensure.js";
import type { Holder, PeerPull, RegistryPull } from "../../src/cluster/ensure.js";
import { ClusterKeys } from "../../src/cluster/keys.js";
import { recordPush, usablePushes } from "../../src/cluster/pushes.js";
import type { CatalogEntry, PushRecord } from "../../src/cluster/records.js";
import { ForkdError } from "../../src/util/errors.js";
import { FakeKv } from "../fakes/kv.js";

const KEYS = new ClusterKeys("/t/");
const MACHINE = { accel: "tcg" as const, qemu: "0", cpu: "qemu64" };
const D = (c: string) => c.repeat(64);

const entry = (
  key: string,
  parent: string | null,
  digest: string,
  owner: string | null = null,
): CatalogEntry => ({
  key,
  owner,
  parent,
  digest,
  origin: "a",
  created: new Date(0).toISOString(),
  machine: MACHINE,
  bytes: 1,
  view: {},
});

/** The chain `base` ← `alice/app` in the catalog, as every node mirrors it. */
const CHAIN = [entry("base", null, D("1")), entry("alice/app", "base", D("2"), "alice")];

/** A node's context: `self`, its catalog `entries`, the digests it holds `held`. */
function context(kv: FakeKv, self: string, entries: CatalogEntry[], held: Record<string, string> = {}) {
  const catalog = new Map(entries.map((e) => [KEYS.catalogEntry(e.key), e]));
  const warnings: string[] = [];
  const ctx = {
    kv,
    keys: KEYS,
    id: self,
    log: { info: () => undefined, warn: (m: string) => void warnings.push(m) },
    machine: MACHINE,
    catalog: { get: (k: string) => catalog.get(k), values: () => catalog.values(), live: true },
    held: { get: (k: string) => held[k] },
    store: { has: async () => false, pending: async () => undefined },
  } as unknown as NodeContext;
  return { ctx, warnings };
}

function fetcher(ctx: NodeContext, entries: CatalogEntry[], pull: PeerPull, fromRegistry: RegistryPull) {
  const byKey = new Map(entries.map((e) => [e.key, e]));
  const guard = {
    entry: (key: string) => byKey.get(key),
    expectCopy: () => undefined,
    copyDone: () => undefined,
  } as unknown as CatalogGuard;
  return new SnapshotFetch(ctx, guard, pull, fromRegistry);
}

/** A peer pull as the real one fails with no holder. */
const noPeer: PeerPull = async (key, holders) => {
  if ((await holders()).length === 0) throw new ForkdError("not_found", `no node holds ${key}`);
};

const push = (ref: string, digest: string) => ({ ref, digest: `sha256:${D(digest)}`, insecure: true });

test("a push is recorded with its chain's digests, and read back while the catalog names the same chain", async () => {
  const kv = new FakeKv();
  const a = context(kv, "a", CHAIN, { base: D("1"), "alice/app": D("2") });
  await recordPush(a.ctx, "alice/app", ["base", "alice/app"], push("reg.test/x:1", "a"));
  const b = context(kv, "b", CHAIN);
  const got = await usablePushes(b.ctx, "alice/app");
  assert.equal(got.length, 1);
  assert.deepEqual(
    { ref: got[0]?.ref, digest: got[0]?.digest, node: got[0]?.node, chain: got[0]?.chain },
    {
      ref: "reg.test/x:1",
      digest: `sha256:${D("a")}`,
      node: "a",
      chain: [
        { key: "base", digest: D("1") },
        { key: "alice/app", digest: D("2") },
      ],
    },
  );
  // The tag made again since (another digest), or an ancestor that changed: not that snapshot.
  const again = context(kv, "b", [CHAIN[0]!, entry("alice/app", "base", D("3"), "alice")]);
  assert.deepEqual(await usablePushes(again.ctx, "alice/app"), []);
  const rebased = context(kv, "b", [entry("base", null, D("4")), CHAIN[1]!]);
  assert.deepEqual(await usablePushes(rebased.ctx, "alice/app"), []);
  // Nothing recorded of a chain held under no digest here (the catalog would not take the copies).
  const c = context(kv, "c", CHAIN, { "alice/app": D("2") });
  await recordPush(c.ctx, "alice/app", ["base", "alice/app"], push("reg.test/y:1", "b"));
  assert.equal((await usablePushes(b.ctx, "alice/app")).length, 1);
  assert.match(c.warnings.join("\n"), /not recorded/);
});

test("no peer holds it: pulled once from its push, under the catalog's keys and owners, for every waiting fork", async () => {
  const kv = new FakeKv();
  const a = context(kv, "a", CHAIN, { base: D("1"), "alice/app": D("2") });
  await recordPush(a.ctx, "alice/app", ["base", "alice/app"], push("reg.test/x:1", "a"));
  const calls: { push: PushRecord; owners: (string | null)[] }[] = [];
  const b = context(kv, "b", CHAIN);
  const f = fetcher(b.ctx, CHAIN, noPeer, async (p, owners) => {
    calls.push({ push: p, owners });
    await new Promise((r) => setTimeout(r, 20));
  });
  await Promise.all([f.ensure("alice/app"), f.ensure("alice/app"), f.ensure("alice/app")]);
  assert.equal(calls.length, 1, "one pull for three forks");
  assert.equal(calls[0]?.push.digest, `sha256:${D("a")}`);
  assert.deepEqual(calls[0]?.owners, [null, "alice"]);
});

test("the newest push first; a failed one moves to the next; all failed: an error naming the peer's reason and each push's", async () => {
  const kv = new FakeKv();
  const a = context(kv, "a", CHAIN, { base: D("1"), "alice/app": D("2") });
  await recordPush(a.ctx, "alice/app", ["base", "alice/app"], push("old.test/x:1", "a"));
  await new Promise((r) => setTimeout(r, 5));
  await recordPush(a.ctx, "alice/app", ["base", "alice/app"], push("new.test/x:1", "b"));
  const tried: string[] = [];
  const b = context(kv, "b", CHAIN);
  const flaky = fetcher(b.ctx, CHAIN, noPeer, async (p) => {
    tried.push(p.ref);
    if (p.ref.startsWith("new")) throw new ForkdError("unavailable", "registry down");
  });
  await flaky.ensure("alice/app");
  assert.deepEqual(tried, ["new.test/x:1", "old.test/x:1"]);
  const broken = fetcher(b.ctx, CHAIN, noPeer, async (p) => {
    throw new ForkdError("unavailable", `${p.ref} refused`);
  });
  await assert.rejects(broken.ensure("alice/app"), (e: unknown) => {
    assert.ok(e instanceof ForkdError);
    assert.equal(e.code, "not_found", "the peer's code");
    assert.match(e.message, /no node holds alice\/app/);
    assert.match(e.message, /new\.test\/x:1@sha256:b+: new\.test\/x:1 refused/);
    assert.match(e.message, /old\.test\/x:1@sha256:a+: old\.test\/x:1 refused/);
    return true;
  });
});

test("a peer that gives it keeps the registry out; no usable push leaves the peer's error as it is", async () => {
  const kv = new FakeKv();
  const a = context(kv, "a", CHAIN, { base: D("1"), "alice/app": D("2") });
  await recordPush(a.ctx, "alice/app", ["base", "alice/app"], push("reg.test/x:1", "a"));
  let registry = 0;
  const b = context(kv, "b", CHAIN);
  const peers: Holder[][] = [];
  const fine = fetcher(
    b.ctx,
    CHAIN,
    async (_k, holders) => void peers.push(await holders()),
    async () => void registry++,
  );
  await fine.ensure("alice/app");
  assert.equal(registry, 0);
  assert.equal(peers.length, 1);
  const stale = [CHAIN[0]!, entry("alice/app", "base", D("9"), "alice")];
  const s = context(kv, "b", stale);
  const none = fetcher(s.ctx, stale, noPeer, async () => void registry++);
  await assert.rejects(none.ensure("alice/app"), { code: "not_found", message: "no node holds alice/app" });
  assert.equal(registry, 0, "a stale push is not pulled");
});

test("a snapshot deleted from the cluster takes its recorded pushes with it", async () => {
  const kv = new FakeKv();
  const a = context(kv, "a", CHAIN, { base: D("1"), "alice/app": D("2") });
  await recordPush(a.ctx, "alice/app", ["base", "alice/app"], push("reg.test/x:1", "a"));
  await recordPush(a.ctx, "base", ["base"], push("reg.test/base:1", "c"));
  assert.deepEqual(await deleteInCluster(a.ctx, "alice/app", { cascade: false, force: false }, []), [
    "alice/app",
  ]);
  assert.equal(await kv.count(KEYS.pushesOf("alice/app")), 0);
  assert.equal(await kv.count(KEYS.pushesOf("base")), 1, "its parent's stay");
});
