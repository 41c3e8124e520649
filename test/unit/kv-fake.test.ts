/**
 * The Kv contract (test/contract/kv.ts) against the in-memory fake (test/fakes/kv.ts), which
 * unit tests of the cluster use in etcd's place.
 */
import { test } from "node:test";
import { kvCases } from "../contract/kv.js";
import { FakeKv } from "../fakes/kv.js";

const kv = new FakeKv();
for (const [name, run] of kvCases) {
  test(`fake kv: ${name}`, () =>
    run({ kv, expire: async (id) => kv.expireLease(id) }, `/t/${name.length}-${Math.random()}/`));
}
