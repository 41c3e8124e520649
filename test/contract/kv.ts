/**
 * The Kv contract (src/etcd/kv.ts): what the cluster relies on of its store, as cases every
 * implementation runs. Runners: test/unit/kv-fake.test.ts (the in-memory fake) and
 * test/integration/etcd-kv.test.ts (a real etcd member). Each case works under its own prefix.
 */
import assert from "node:assert/strict";
import type { Kv, KvWatchEvent } from "../../src/etcd/kv.js";
import { PrefixMirror } from "../../src/etcd/mirror.js";

export interface KvFixture {
  kv: Kv;
  /** Makes a lease expire now, as etcd would after its TTL (a fake ends it; etcd: revoke it). */
  expire: (leaseId: string) => Promise<void>;
}

const until = async (ok: () => boolean, ms = 5000): Promise<void> => {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 10));
  }
};

export const kvCases: [string, (f: KvFixture, p: string) => Promise<void>][] = [
  [
    "put, get, list in key order, count, delete",
    async ({ kv }, p) => {
      assert.equal(await kv.get(`${p}a`), null);
      const r1 = await kv.put(`${p}b`, "2");
      const r2 = await kv.put(`${p}a`, "1");
      assert.ok(r2 > r1);
      const a = await kv.get(`${p}a`);
      assert.equal(a?.value, "1");
      assert.equal(a?.version, 1);
      assert.equal(a?.createRevision, r2);
      await kv.put(`${p}a`, "1b");
      const a2 = await kv.get(`${p}a`);
      assert.equal(a2?.version, 2);
      assert.equal(a2?.createRevision, r2);
      const l = await kv.list(p);
      assert.deepEqual(
        l.entries.map((e) => [e.key, e.value]),
        [
          [`${p}a`, "1b"],
          [`${p}b`, "2"],
        ],
      );
      assert.ok(l.revision >= (a2?.modRevision ?? 0));
      assert.equal((await kv.list(p, 1)).entries.length, 1);
      assert.equal(await kv.count(p), 2);
      await kv.delete(`${p}a`);
      await kv.delete(`${p}missing`);
      assert.equal(await kv.count(p), 1);
    },
  ],
  [
    "a list longer than a page, or larger than a reply of gRPC's default bound: all of it, in key order",
    async ({ kv }, p) => {
      const keys = Array.from({ length: 1201 }, (_, i) => `${p}k${String(i).padStart(5, "0")}`);
      for (let i = 0; i < keys.length; i += 100)
        await kv.txn(
          [],
          keys.slice(i, i + 100).map((key) => ({ type: "put" as const, key, value: "v" })),
        );
      await kv.put(`${p.slice(0, -1)}~after`, "not under the prefix");
      const all = await kv.list(p);
      assert.deepEqual(
        all.entries.map((e) => e.key),
        keys,
      );
      assert.deepEqual(
        (await kv.list(p, 700)).entries.map((e) => e.key),
        keys.slice(0, 700),
      );
      // 100 records of 60 KiB: 6 MB in all, past the 4 MiB one reply may carry by default.
      const big = "x".repeat(60 << 10);
      for (let i = 0; i < 100; i += 10)
        await kv.txn(
          [],
          Array.from({ length: 10 }, (_, j) => ({
            type: "put" as const,
            key: `${p}big/${i + j}`,
            value: big,
          })),
        );
      const got = await kv.list(`${p}big/`);
      assert.equal(got.entries.length, 100);
      assert.ok(got.entries.every((e) => e.value.length === big.length));
    },
  ],
  [
    "a transaction runs then or otherwise, atomically, by its compares",
    async ({ kv }, p) => {
      const created = await kv.txn(
        [{ key: `${p}x`, target: "version", op: "==", value: 0 }],
        [
          { type: "put", key: `${p}x`, value: "one" },
          { type: "put", key: `${p}idx/x`, value: "" },
        ],
      );
      assert.equal(created.succeeded, true);
      const again = await kv.txn(
        [{ key: `${p}x`, target: "version", op: "==", value: 0 }],
        [{ type: "put", key: `${p}x`, value: "two" }],
        [{ type: "put", key: `${p}lost`, value: "race" }],
      );
      assert.equal(again.succeeded, false);
      assert.equal((await kv.get(`${p}x`))?.value, "one");
      assert.equal((await kv.get(`${p}lost`))?.value, "race");
      const x = await kv.get(`${p}x`);
      const cas = await kv.txn(
        [{ key: `${p}x`, target: "mod", op: "==", value: x?.modRevision ?? 0 }],
        [{ type: "delete", key: `${p}idx/`, prefix: true }],
      );
      assert.equal(cas.succeeded, true);
      assert.equal(await kv.count(`${p}idx/`), 0);
      const byValue = await kv.txn([{ key: `${p}x`, target: "value", op: "==", value: "one" }], []);
      assert.equal(byValue.succeeded, true);
      const none = await kv.txn([], [{ type: "put", key: `${p}free`, value: "1" }]);
      assert.equal(none.succeeded, true);
      assert.equal((await kv.get(`${p}free`))?.value, "1");
    },
  ],
  [
    "a transaction of more than 128 compares or operations in a branch is refused; 128 are done",
    async ({ kv }, p) => {
      const puts = (n: number) =>
        Array.from({ length: n }, (_, i) => ({ type: "put" as const, key: `${p}k${i}`, value: "v" }));
      const absent = (n: number) =>
        Array.from({ length: n }, (_, i) => ({
          key: `${p}c${i}`,
          target: "version" as const,
          op: "==" as const,
          value: 0,
        }));
      await assert.rejects(kv.txn([], puts(129)));
      await assert.rejects(kv.txn(absent(129), puts(1)));
      assert.equal(await kv.count(p), 0);
      assert.equal((await kv.txn(absent(128), puts(128))).succeeded, true);
      assert.equal(await kv.count(p), 128);
    },
  ],
  [
    "a watch replays from a revision, then follows puts and deletes in order",
    async ({ kv }, p) => {
      const from = await kv.put(`${p}early`, "e");
      const seen: KvWatchEvent[] = [];
      const w = await kv.watch(
        p,
        from,
        (e) => seen.push(e),
        () => undefined,
      );
      await kv.put(`${p}k`, "v");
      await kv.delete(`${p}k`);
      await kv.put(`${p}other-prefix-not`, "x");
      await until(() => seen.length >= 4);
      assert.deepEqual(
        seen.slice(0, 3).map((e) => [e.type, e.key, e.value]),
        [
          ["put", `${p}early`, "e"],
          ["put", `${p}k`, "v"],
          ["delete", `${p}k`, ""],
        ],
      );
      assert.ok(seen.every((e, i) => i === 0 || e.modRevision > (seen[i - 1]?.modRevision ?? 0)));
      await w.close();
      await kv.put(`${p}after`, "a");
      await new Promise((r) => setTimeout(r, 100));
      assert.ok(!seen.some((e) => e.key === `${p}after`), "a closed watch tells nothing");
    },
  ],
  [
    "keys under a lease vanish when it expires; a put under a dead lease fails",
    async ({ kv, expire }, p) => {
      const lease = await kv.grantLease(3);
      let lost: string | null = null;
      lease.onLost((why) => (lost = why));
      await kv.put(`${p}leased`, "1", lease.id);
      await kv.put(`${p}kept`, "1");
      assert.equal((await kv.get(`${p}leased`))?.lease, lease.id);
      await expire(lease.id);
      await until(() => lost !== null, 15_000);
      assert.equal(await kv.get(`${p}leased`), null);
      assert.equal((await kv.get(`${p}kept`))?.value, "1");
      await assert.rejects(kv.put(`${p}again`, "1", lease.id));
      const l2 = await kv.grantLease(3);
      await kv.put(`${p}l2`, "1", l2.id);
      await l2.revoke();
      assert.equal(await kv.get(`${p}l2`), null);
    },
  ],
  [
    "a fencing compare: a write only while the writer's lease holds its key",
    async ({ kv, expire }, p) => {
      const lease = await kv.grantLease(3);
      await kv.put(`${p}node`, "me", lease.id);
      const fenced = () =>
        kv.txn(
          [{ key: `${p}node`, target: "lease", op: "==", value: lease.id }],
          [{ type: "put", key: `${p}work`, value: "w" }],
        );
      assert.equal((await fenced()).succeeded, true);
      await expire(lease.id);
      assert.equal((await fenced()).succeeded, false);
    },
  ],
  [
    "a mirror lists, then follows, and parses what it holds",
    async ({ kv }, p) => {
      await kv.put(`${p}m/a`, "1");
      await kv.put(`${p}m/bad`, "not a number");
      const problems: string[] = [];
      const m = new PrefixMirror<number>({
        kv,
        prefix: `${p}m/`,
        parse: (_k, v) => (/^\d+$/.test(v) ? Number(v) : null),
        onProblem: (w) => problems.push(w),
      });
      await m.start();
      assert.equal(m.get(`${p}m/a`), 1);
      assert.equal(m.get(`${p}m/bad`), undefined);
      assert.ok(problems.some((w) => w.includes("bad")));
      const r = await kv.put(`${p}m/b`, "2");
      await kv.delete(`${p}m/a`);
      assert.equal(await m.caughtUp(r + 1, 5000), true);
      assert.deepEqual([...m.entries()], [[`${p}m/b`, 2]]);
      await m.close();
    },
  ],
];
