/**
 * The gateway's memory per sandbox, measured apart from a running gateway (whose RSS moves with
 * its garbage collector by more than 10,000 records weigh): the gateway's own view of the cluster
 * (src/cluster/view.ts, the mirrors it keeps) started over an in-memory etcd (test/fakes/kv.ts)
 * holding `count` sandboxes as nodes write them (their keys and values read back as new strings,
 * as etcd's client decodes them); the heap after a full collection, before and after the view
 * lists them, in this process (V8's gc exposed for the measure).
 */
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { ClusterKeys, ClusterView } from "../src/cluster/index.js";
import type { SandboxLocation } from "../src/cluster/index.js";
import { newSandboxId } from "../src/util/ids.js";
import { FakeKv } from "../test/fakes/kv.js";

function collector(): () => void {
  setFlagsFromString("--expose-gc");
  return runInNewContext("gc") as () => void;
}

async function heapAfterGc(gc: () => void): Promise<number> {
  for (let i = 0; i < 3; i++) {
    gc();
    await new Promise((r) => setImmediate(r));
  }
  return process.memoryUsage().heapUsed;
}

/** Bytes of the gateway's heap per sandbox record mirrored (`nodes` nodes, `count` sandboxes). */
export async function mirrorBytesPerSandbox(count: number, nodes: number): Promise<number> {
  const gc = collector();
  const keys = new ClusterKeys("/m/");
  const kv = new FakeKv();
  const t0 = Date.now();
  for (let i = 0; i < count; i++) {
    const now = new Date(t0 + i).toISOString();
    const id = newSandboxId();
    const node = `n${String((i % nodes) + 1).padStart(3, "0")}`;
    const loc: SandboxLocation = {
      id,
      node,
      owner: "bench",
      tag: "base",
      state: "running",
      reason: null,
      created: now,
      updated: now,
    };
    await kv.txn(
      [],
      [
        { type: "put", key: keys.sandbox(id), value: JSON.stringify(loc) },
        { type: "put", key: keys.byNodeEntry(node, id), value: "" },
        { type: "put", key: keys.byOwnerEntry("bench", id), value: "" },
      ],
    );
  }
  // Keys and values decoded afresh, as etcd's client gives them (not the fake's own strings).
  const fresh = (x: string) => Buffer.from(x, "utf8").toString("utf8");
  const decoded = Object.assign(Object.create(kv) as FakeKv, {
    list: async (prefix: string, limit?: number) => {
      const r = await kv.list(prefix, limit);
      return { ...r, entries: r.entries.map((e) => ({ ...e, key: fresh(e.key), value: fresh(e.value) })) };
    },
  });
  const view = new ClusterView({ kv: decoded, keys });
  const before = await heapAfterGc(gc);
  await view.start();
  const after = await heapAfterGc(gc);
  const held = view.sandboxes().length;
  await view.close();
  await kv.close();
  return (after - before) / Math.max(1, held);
}
