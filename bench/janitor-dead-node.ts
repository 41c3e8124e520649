/**
 * The time the janitor (src/cluster/janitor.ts) takes to mark lost every sandbox of one dead
 * node, on a real etcd member: `--sandboxes` records of one node (with their by-node/ and
 * by-owner/ keys) marked a record to a transaction, 16 at once (`markOne`, as the janitor did
 * before its batches), then the same count marked by `nodeGone` (batched), then by two janitors
 * at once (two gateways), each over its own prefix in the same etcd, the same run; `--others`
 * records of 100 live nodes lie beside them (the rest of the cluster). Each janitor has its own
 * mirror of sandboxes/, as a gateway's has. Prints each
 * time, the ratio, and the transactions the janitors sent.
 *
 *   node dist/bench/janitor-dead-node.js [--sandboxes 10000] [--others 0] [--parallel N] [--json-out FILE]
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ClusterKeys, Janitor, SandboxLocation, lostReason, parseRecord } from "../src/cluster/index.js";
import { EtcdKv, PrefixMirror, parseEndpoints } from "../src/etcd/index.js";
import type { Kv, KvOp } from "../src/etcd/index.js";
import { startEtcd } from "./cluster-procs.js";
import { r1 } from "./stats.js";

const { values: args } = parseArgs({
  options: {
    sandboxes: { type: "string" },
    others: { type: "string" },
    parallel: { type: "string" },
    "json-out": { type: "string" },
  },
});
const N = Number(args.sandboxes ?? 10_000);
if (!Number.isInteger(N) || N < 1 || N > 26 ** 4) throw new Error(`--sandboxes: ${String(args.sandboxes)}`);
/** Batches in flight per janitor (the Janitor's `parallel`; its default unless given). */
const PARALLEL = args.parallel === undefined ? undefined : Number(args.parallel);
/** Records of other, live nodes beside the dead node's (the rest of the cluster). */
const OTHERS = Number(args.others ?? 0);
if (!Number.isInteger(OTHERS) || OTHERS < 0 || N + OTHERS > 26 ** 4)
  throw new Error(`--others: ${String(args.others)}`);
const NODE = "dead";
const log = (s: string) => process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${s}\n`);

/** Sandbox id `i` (valid: sb- and 16 of a-z2-7). */
const sid = (i: number) =>
  `sb-${"a".repeat(12)}${[3, 2, 1, 0].map((p) => String.fromCharCode(97 + (Math.floor(i / 26 ** p) % 26))).join("")}`;

/**
 * Writes N running records of NODE and OTHERS of 100 live nodes (ids interleaved) under `keys`,
 * half with an owner, 40 to a transaction.
 */
async function seed(kv: Kv, keys: ClusterKeys): Promise<void> {
  const at = new Date().toISOString();
  const all = N + OTHERS;
  // Exactly N of the dead node, spread evenly.
  const nodeOf = (j: number) =>
    Math.floor((j * N) / all) !== Math.floor(((j + 1) * N) / all) ? NODE : `live-${j % 100}`;
  for (let i = 0; i < all; i += 40) {
    const ops: KvOp[] = [];
    for (let j = i; j < Math.min(all, i + 40); j++) {
      const owner = j % 2 ? "alice" : null;
      const node = nodeOf(j);
      const r: SandboxLocation = {
        ...{ id: sid(j), node, owner, tag: "app", state: "running" as const, reason: null },
        ...{ created: at, updated: at },
      };
      ops.push({ type: "put", key: keys.sandbox(r.id), value: JSON.stringify(r) });
      ops.push({ type: "put", key: keys.byNodeEntry(node, r.id), value: "" });
      if (owner) ops.push({ type: "put", key: keys.byOwnerEntry(owner, r.id), value: "" });
    }
    await kv.txn([], ops);
  }
}

/** How many of the records under `keys` are lost, and the index keys left of NODE (by-node/ and by-owner/). */
async function check(kv: Kv, keys: ClusterKeys): Promise<{ lost: number; indexLeft: number }> {
  const all = (await kv.list(keys.sandboxes)).entries.map((e) => parseRecord(SandboxLocation, e.value));
  const owned = new Set(all.filter((r) => r?.node === NODE && r.owner).map((r) => r?.id));
  const byOwner = (await kv.list(keys.byOwner("alice"))).entries.filter((e) =>
    owned.has(e.key.slice(keys.byOwner("alice").length)),
  );
  return {
    lost: all.filter((r) => r?.state === "lost").length,
    indexLeft: (await kv.count(keys.byNode(NODE))) + byOwner.length,
  };
}

/** `kv` with its transactions counted (`n`). */
function counted(kv: Kv): { kv: Kv; n: () => number } {
  let n = 0;
  const txn: Kv["txn"] = (c, t, o) => {
    n++;
    return kv.txn(c, t, o);
  };
  return {
    kv: new Proxy(kv, { get: (k, p) => (p === "txn" ? txn : (Reflect.get(k, p, k) as unknown)) }),
    n: () => n,
  };
}

/** Main's janitor before its batches: list the node's by-node keys, one record a txn, 16 at once. */
async function perRecord(kv: Kv, keys: ClusterKeys, j: Janitor): Promise<number> {
  const ids = (await kv.list(keys.byNode(NODE))).entries.map((e) => e.key.slice(keys.byNode(NODE).length));
  const reason = lostReason(NODE, Date.now());
  let next = 0;
  let marked = 0;
  const worker = async () => {
    while (next < ids.length) {
      const ok = await j.markOne(NODE, ids[next++] ?? "", reason);
      if (ok) marked++;
    }
  };
  await Promise.all(Array.from({ length: 16 }, worker));
  return marked;
}

interface Figure {
  how: string;
  ms: number;
  marked: number;
  lost: number;
  indexLeft: number;
  txns: number;
}

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-bench-janitor-"));
  const etcd = await startEtcd(dir, 1);
  const url = etcd.urls[0] ?? "";
  const real = new EtcdKv(parseEndpoints(`etcd://${url.slice("http://".length)}`), { callMs: 30_000 });
  const { kv, n: txnsSoFar } = counted(real);
  const load0 = loadavg()[0] ?? 0;
  const figures: Figure[] = [];
  try {
    // Each janitor as a gateway runs it: with a mirror of sandboxes/ (two gateways, two mirrors).
    const runs: [string, (keys: ClusterKeys, j: (i: number) => Janitor) => Promise<number>][] = [
      ["one record a transaction (16 at once: before)", (keys, j) => perRecord(kv, keys, j(0))],
      ["batched (`nodeGone`: after)", (_keys, j) => j(0).nodeGone(NODE)],
      [
        "batched, two janitors at once (two gateways)",
        async (_keys, j) =>
          (await Promise.all([j(0).nodeGone(NODE), j(1).nodeGone(NODE)])).reduce((a, b) => a + b),
      ],
    ];
    for (const [i, [how, run]] of runs.entries()) {
      const keys = new ClusterKeys(`/bench-${i}/`);
      log(`seeding ${N} records of node ${NODE} (and ${OTHERS} of live nodes) under ${keys.prefix}`);
      await seed(kv, keys);
      const mirrors = [0, 1].map(
        () =>
          new PrefixMirror<SandboxLocation>({
            kv: real,
            prefix: keys.sandboxes,
            parse: (_k, v) => parseRecord(SandboxLocation, v),
          }),
      );
      await Promise.all(mirrors.map((m) => m.start()));
      const j = (n: number) => {
        const m = mirrors[n] as PrefixMirror<SandboxLocation>;
        return new Janitor({
          ...{ kv, keys, present: () => false, records: () => m.values() },
          record: (id) => m.get(keys.sandbox(id)),
          ...(PARALLEL !== undefined ? { parallel: PARALLEL } : {}),
        });
      };
      const txns0 = txnsSoFar();
      log(`marking: ${how}`);
      const t0 = performance.now();
      const marked = await run(keys, j);
      const ms = performance.now() - t0;
      const txns = txnsSoFar() - txns0;
      await Promise.all(mirrors.map((m) => m.close()));
      const c = await check(kv, keys);
      figures.push({ how, ms: r1(ms), marked, ...c, txns });
      log(`${how}: ${r1(ms / 1000)} s, ${marked} marked, ${c.lost} lost, ${c.indexLeft} index keys left`);
    }
  } finally {
    await real.close();
    await Promise.all(etcd.members.map((m) => m.stop(5_000)));
    await rm(dir, { recursive: true, force: true });
  }
  const [before, after] = figures;
  const ratio = before && after ? r1(before.ms / after.ms) : NaN;
  const out = [
    "| how | time | marked | lost | index keys left | transactions |",
    "|---|---|---|---|---|---|",
  ];
  for (const f of figures)
    out.push(`| ${f.how} | ${r1(f.ms / 1000)} s | ${f.marked} | ${f.lost} | ${f.indexLeft} | ${f.txns} |`);
  out.push(
    "",
    `${N} sandboxes of one dead node: before / after = ${ratio}× (load average ${r1(load0)} → ${r1(loadavg()[0] ?? 0)})`,
  );
  process.stdout.write(out.join("\n") + "\n");
  if (args["json-out"])
    await writeFile(args["json-out"], JSON.stringify({ sandboxes: N, figures, ratio }, null, 2));
  if (figures.some((f) => f.lost !== N || f.indexLeft !== 0 || f.marked !== N)) {
    process.stderr.write("some records were not marked exactly once\n");
    process.exitCode = 1;
  }
}

main().catch((e: unknown) => {
  process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
