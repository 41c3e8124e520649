/**
 * Snapshot tags by namespace without VMs (src/snapshot/namespace.ts, the store's keys): keys and
 * their directories (no path tricks), the reserved tags, the resolver's answers for a tenant and
 * an admin (its own first, then shared, another tenant's never; creation refused for reserved,
 * taken and foreign tags), and a store holding two tenants' snapshots of one tag side by side
 * with a data directory's plain (legacy) tags: listed, recovered, failed records kept; a
 * tenant's chain packed by its tags without namespace.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  DEFAULT_RESERVED_TAGS,
  Namespaces,
  keyDir,
  keyOfDir,
  nameFor,
  reservedTags,
  shownTo,
  splitKey,
  visibleTo,
} from "../../src/snapshot/namespace.js";
import { SnapshotStore } from "../../src/snapshot/store.js";
import { IMAGE_FILES } from "../../src/image/content.js";
import { readMeta, writeMeta } from "../../src/snapshot/meta.js";
import type { SnapshotMeta } from "../../src/snapshot/meta.js";
import { stagePack } from "../../src/snapshot/pack.js";
import { ForkdError } from "../../src/util/errors.js";
import { isValidKey } from "../../src/util/ids.js";
import { Quarantine } from "../../src/util/quarantine.js";
import { fakeSnapshot } from "../helpers/snapshots.js";

async function scratch(): Promise<{ root: string; store: SnapshotStore; done: () => Promise<void> }> {
  const root = await mkdtemp(join(tmpdir(), "forkd-ns-"));
  await mkdir(join(root, "snapshots"));
  return {
    root,
    store: new SnapshotStore(join(root, "snapshots")),
    done: () => rm(root, { recursive: true, force: true }),
  };
}

const code = (e: unknown, c: string) => e instanceof ForkdError && e.code === c;

test("keys: TAG or TENANT/TAG, one directory each, and nothing that leaves the store", () => {
  for (const k of ["python", "alice/app", "a.b-c/X_1", "A"]) assert.ok(isValidKey(k), k);
  for (const k of [
    "",
    ".",
    "..",
    "../x",
    "alice/../x",
    "alice/..",
    "a/b/c",
    "/x",
    "x/",
    "Alice/app", // tenants are lowercase
    "alice~app",
    "alice/.hidden",
    "x".repeat(65),
    `${"a".repeat(65)}/x`,
    "a\\b",
    "a\0b",
    "a b",
  ])
    assert.ok(!isValidKey(k), JSON.stringify(k));
  assert.equal(keyDir("python"), "python");
  assert.equal(keyDir("alice/app"), "alice~app");
  assert.throws(() => keyDir("../x"), /invalid tag/);
  for (const k of ["python", "alice/app"]) assert.equal(keyOfDir(keyDir(k)), k);
  for (const d of [".staging-x", ".failed-x.json", "Alice~x", "a~b~c", "~x", "x~", "a~.x", "quarantine~"])
    assert.equal(keyOfDir(d), null, d);
  assert.deepEqual(splitKey("alice/app"), { ns: "alice", name: "app" });
  assert.deepEqual(splitKey("app"), { ns: null, name: "app" });
  // Shown: a tenant its own without namespace; an admin the key.
  assert.equal(nameFor("alice", "alice/app"), "app");
  assert.equal(nameFor("alice", "python"), "python");
  assert.equal(nameFor(null, "alice/app"), "alice/app");
});

test("reserved tags: E2B's defaults, plus FORKD_RESERVED_TAGS; '-' reserves none; a bad one stops the start", () => {
  assert.deepEqual([...reservedTags(undefined)].sort(), [...DEFAULT_RESERVED_TAGS].sort());
  assert.ok(reservedTags(undefined).has("code-interpreter-v1") && reservedTags(undefined).has("base"));
  assert.ok(!reservedTags(undefined).has("default"), "forkd's SDK default: each tenant may have its own");
  const r = reservedTags(" python , team-base,");
  assert.ok(r.has("python") && r.has("team-base") && r.has("base"));
  assert.equal(reservedTags("-").size, 0);
  assert.throws(() => reservedTags("ok,../x"), /FORKD_RESERVED_TAGS/);
  assert.throws(() => reservedTags("alice/x"), /FORKD_RESERVED_TAGS/);
});

test("visibility: a tenant sees its namespace and shared ones; its own tag hides a shared one of that name", () => {
  assert.ok(visibleTo("alice", "alice/x", "alice"));
  assert.ok(visibleTo("alice", "x", null));
  assert.ok(visibleTo("alice", "x", "alice"), "a legacy snapshot of its own");
  assert.ok(!visibleTo("alice", "bob/x", "bob"));
  assert.ok(!visibleTo("alice", "x", "bob"), "a legacy snapshot of another tenant's");
  assert.ok(!visibleTo("alice", "x", "@admin"));
  assert.ok(!visibleTo("alice", "bob/x", null), "a key's namespace decides, whatever its owner says");
  assert.ok(visibleTo(null, "bob/x", "bob"));
  const all = [
    { k: "x", o: null },
    { k: "alice/x", o: "alice" },
    { k: "bob/x", o: "bob" },
    { k: "y", o: null },
  ];
  assert.deepEqual(
    shownTo(
      "alice",
      all,
      (a) => a.k,
      (a) => a.o,
    ).map((a) => a.k),
    ["alice/x", "y"],
  );
  assert.equal(
    shownTo(
      null,
      all,
      (a) => a.k,
      (a) => a.o,
    ).length,
    4,
  );
});

test("resolver: own first, then shared; another tenant's never; creation refused for reserved, taken and foreign tags", async () => {
  const { store, done } = await scratch();
  try {
    const ns = new Namespaces(store, reservedTags("team-base"));
    await fakeSnapshot(store, "python", null); // shared
    await fakeSnapshot(store, "alice/app", "alice");
    await fakeSnapshot(store, "bob/app", "bob");
    await fakeSnapshot(store, "legacy", "bob"); // a tenant's from before namespaces
    await fakeSnapshot(store, "private", "@admin");

    assert.equal(await ns.find("alice", "app"), "alice/app");
    assert.equal(await ns.find("bob", "app"), "bob/app");
    assert.equal(await ns.find("alice", "alice/app"), "alice/app", "its own, named with its namespace");
    assert.equal(await ns.find("alice", "bob/app"), null);
    assert.equal(await ns.find("alice", "python"), "python");
    assert.equal(await ns.find("alice", "legacy"), null);
    assert.equal(await ns.find("bob", "legacy"), "legacy");
    assert.equal(await ns.find("alice", "private"), null);
    assert.equal(await ns.find(null, "bob/app"), "bob/app");
    assert.equal(await ns.find(null, "app"), null, "an admin's plain tag is the admins' namespace");
    await assert.rejects(ns.find("alice", "../x"), (e) => code(e, "invalid_argument"));

    // Creation: in its own namespace, whatever other tenants hold.
    assert.equal(await ns.forNew("carol", "app"), "carol/app");
    assert.equal(await ns.forNew("alice", "legacy"), "alice/legacy");
    assert.equal(await ns.forNew("alice", "private"), "alice/private");
    await assert.rejects(ns.forNew("alice", "app"), (e) => code(e, "conflict"));
    await assert.rejects(ns.forNew("bob", "legacy"), (e) => code(e, "conflict"));
    await assert.rejects(
      ns.forNew("alice", "python"),
      (e) => code(e, "conflict") && /shared/.test(String(e)),
    );
    await assert.rejects(ns.forNew("alice", "bob/x"), (e) => code(e, "invalid_argument"));
    // Reserved: one answer, whether a snapshot has the tag or not.
    const refusal = async (viewer: string | null, tag: string) =>
      ns.forNew(viewer, tag).then(
        () => "created",
        (e: unknown) => (e instanceof ForkdError ? `${e.code}: ${e.message}` : String(e)),
      );
    const before = await refusal("alice", "code-interpreter-v1");
    assert.match(before, /^forbidden: .*reserved/);
    await fakeSnapshot(store, "code-interpreter-v1", null);
    assert.equal(await refusal("alice", "code-interpreter-v1"), before);
    assert.equal(await refusal("alice", "alice/code-interpreter-v1"), before);
    assert.match(await refusal("alice", "team-base"), /^forbidden/);
    assert.match(
      await refusal(null, "bob/base"),
      /^forbidden/,
      "not even an admin puts one in a tenant's namespace",
    );
    assert.equal(await ns.forNew(null, "team-base"), "team-base", "the admins' namespace holds them");
    assert.equal(await ns.find("alice", "code-interpreter-v1"), "code-interpreter-v1");
    // An admin: keys as written; a tenant's namespace by its rules.
    await assert.rejects(ns.forNew(null, "python"), (e) => code(e, "conflict"));
    assert.equal(await ns.forNew(null, "app"), "app");
    await assert.rejects(ns.forNew(null, "bob/app"), (e) => code(e, "conflict"));
    assert.equal(await ns.forNew(null, "bob/new"), "bob/new");
    // A pack's tags: what the caller sees under them, else new in its namespace.
    assert.equal(await ns.place("alice", "python"), "python");
    assert.equal(await ns.place("alice", "app"), "alice/app");
    assert.equal(await ns.place("alice", "legacy"), "alice/legacy");
    await assert.rejects(ns.place("alice", "base"), (e) => code(e, "forbidden"));
  } finally {
    await done();
  }
});

test("store: two tenants' snapshots of one tag side by side with plain tags; listed, verified, recovered", async () => {
  const { root, store, done } = await scratch();
  try {
    await fakeSnapshot(store, "shared", null);
    await fakeSnapshot(store, "alice/app", "alice");
    await fakeSnapshot(store, "bob/app", "bob");
    await fakeSnapshot(store, "old", "alice"); // a data directory's tag from before namespaces
    assert.deepEqual((await readdir(join(root, "snapshots"))).sort(), [
      "alice~app",
      "bob~app",
      "old",
      "shared",
    ]);
    assert.deepEqual((await store.list()).map((m) => m.tag).sort(), [
      "alice/app",
      "bob/app",
      "old",
      "shared",
    ]);
    assert.equal((await store.get("alice/app")).meta.owner, "alice");
    assert.equal((await store.get("bob/app")).meta.owner, "bob");
    assert.deepEqual(await store.lookup("bob/app"), { owner: "bob", status: "ready" });
    assert.equal(await store.lookup("carol/app"), undefined);
    // A failed write of a tenant's tag is kept under its key.
    await store.recordFailed(
      { tag: "alice/broke", started: new Date().toISOString(), source: null, owner: "alice" },
      new Error("boom"),
    );
    assert.deepEqual(
      (await store.listPending()).map((p) => [p.tag, p.status]),
      [["alice/broke", "failed"]],
    );
    // Recovery (a restart) keeps every one: none is taken for unreadable state.
    const fresh = new SnapshotStore(join(root, "snapshots"));
    const quarantined: string[] = [];
    await fresh.recover(new Quarantine(join(root, "quarantine"), { warn: (m) => quarantined.push(m) }));
    assert.deepEqual(quarantined, []);
    assert.deepEqual((await fresh.list()).map((m) => m.tag).sort(), [
      "alice/app",
      "bob/app",
      "old",
      "shared",
    ]);
    assert.equal((await fresh.pending("alice/broke"))?.status, "failed");
    await fresh.delete("alice/app");
    assert.equal(await fresh.has("alice/app"), false);
    assert.equal(await fresh.has("bob/app"), true);
    // A key that would leave the store never becomes a path.
    for (const bad of ["../x", "alice/../../x", "a/b/c"]) {
      assert.throws(() => fresh.filesFor(bad), /invalid tag/);
      await assert.rejects(fresh.get(bad), /invalid tag/);
      await assert.rejects(fresh.delete(bad), /invalid tag/);
    }
  } finally {
    await done();
  }
});

test("packs: a tenant's chain is packed by its tags without namespace, the rewritten metadata consistent", async () => {
  const { root, store, done } = await scratch();
  try {
    const img = join(root, "image");
    await mkdir(img);
    for (const f of IMAGE_FILES) await writeFile(join(img, f), f);
    /** A fake snapshot booting `img`, stacked on `parent`. */
    const make = async (tag: string, owner: string | null, parent?: SnapshotMeta): Promise<SnapshotMeta> => {
      await fakeSnapshot(store, tag, owner);
      const f = store.filesFor(tag);
      const { checksum: _c, ...m } = await readMeta(f.meta);
      store.forget(tag);
      return writeMeta(f.meta, {
        ...m,
        image: { ...m.image, dir: img },
        ...(parent ? { parent: { tag: parent.tag, checksum: parent.checksum } } : {}),
      });
    };
    const python = await make("python", null);
    const base = await make("alice/base", "alice", python);
    await make("alice/app", "alice", base);
    const out = join(root, "pack");
    const manifest = await stagePack(store, "alice/app", out);
    assert.deepEqual([manifest.tag, manifest.chain], ["app", ["python", "base", "app"]]);
    assert.deepEqual((await readdir(join(out, "snapshots"))).sort(), ["app", "base", "python"]);
    const packed = (name: string) => readMeta(join(out, "snapshots", name, "meta.json"));
    assert.equal((await packed("python")).checksum, python.checksum, "a shared one as it is");
    const pBase = await packed("base");
    assert.deepEqual(
      [pBase.tag, pBase.parent?.tag, pBase.parent?.checksum],
      ["base", "python", python.checksum],
    );
    const pApp = await packed("app");
    assert.deepEqual([pApp.tag, pApp.parent?.tag, pApp.parent?.checksum], ["app", "base", pBase.checksum]);
    for (const name of manifest.chain) {
      const sum = manifest.files[`snapshots/${name}/meta.json`];
      assert.equal(
        sum?.sha256,
        createHash("sha256")
          .update(await readFile(join(out, "snapshots", name, "meta.json")))
          .digest("hex"),
      );
    }
    assert.ok(!JSON.stringify(manifest).includes("alice"), "the pack does not name the tenant's namespace");
  } finally {
    await done();
  }
});
