/**
 * Issue 25's "past this machine" benchmark: a cluster of many nodes whose VMMs are the fake
 * driver's (the real node code, several nodes per process; a real etcd; a real `forkd gateway`),
 * at several sizes, each from a fresh etcd: the gateway's placement rate, its added latency per
 * call against the same call to a node direct (p50/p99), etcd's writes and bytes per create, the
 * gateway's memory per sandbox, and the time until a killed node's sandboxes are listed lost; then
 * how each grows with the nodes.
 *
 *   node dist/bench/cluster-scale.js [--nodes 10,30,100] [--per-node 100 | --sandboxes 10000]
 *     [--concurrency 64] [--batch 100] [--batch-concurrency 2] [--latency-samples 400]
 *     [--create-samples 40] [--etcd-members 1] [--nodes-per-process 25] [--node-limits]
 *     [--quick] [--json-out FILE]
 *
 * Sandboxes are proportional to the nodes (`--per-node`, 100: 10,000 at 100 nodes) unless
 * `--sandboxes` fixes one count for every size. Half are created one child per request
 * (`--concurrency` at once), half in `fork -n --batch` requests. The nodes' per-caller limits
 * (50 requests/s, 8 forks in flight per token on each node) are off unless `--node-limits`: one
 * token drives the whole load here. `--quick`: one size of 6 nodes, 300 sandboxes (a smoke run).
 */
import { execFile } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { loadavg } from "node:os";
import { parseArgs, promisify } from "node:util";
import { REPO_DIR } from "../src/host/paths.js";
import { mirrorBytesPerSandbox } from "./cluster-mirror-memory.js";
import { runSize } from "./cluster-size.js";
import type { SizeResult } from "./cluster-size.js";
import { r1, r2 } from "./stats.js";

/** The fewest sandbox records the mirror's memory is measured over (in memory: ~1.5 MB). */
const MIRROR_MIN_RECORDS = 10_000;

const { values: args } = parseArgs({
  options: {
    nodes: { type: "string" },
    "per-node": { type: "string" },
    sandboxes: { type: "string" },
    concurrency: { type: "string" },
    batch: { type: "string" },
    "batch-concurrency": { type: "string" },
    "latency-samples": { type: "string" },
    "create-samples": { type: "string" },
    "etcd-members": { type: "string" },
    "nodes-per-process": { type: "string" },
    "node-limits": { type: "boolean", default: false },
    quick: { type: "boolean", default: false },
    "json-out": { type: "string" },
  },
});

const num = (name: keyof typeof args, full: number, quick: number): number => {
  const v = args[name];
  const n = typeof v === "string" ? Number(v) : args.quick ? quick : full;
  if (!Number.isInteger(n) || n < 0) throw new Error(`--${name}: ${String(v)} is not a whole number`);
  return n;
};
const sizes = (args.nodes ?? (args.quick ? "6" : "10,30,100")).split(",").map((s) => {
  const n = Number(s);
  if (!Number.isInteger(n) || n < 2 || n > 500) throw new Error(`--nodes: ${s} is not in 2..500`);
  return n;
});
const perNode = num("per-node", 100, 50);
const fixed = args.sandboxes === undefined ? null : num("sandboxes", 0, 0);
const opts = {
  concurrency: num("concurrency", 64, 16),
  batch: num("batch", 100, 30),
  batchConcurrency: num("batch-concurrency", 2, 2),
  latencySamples: num("latency-samples", 400, 60),
  createSamples: num("create-samples", 40, 10),
  etcdMembers: num("etcd-members", 1, 1),
  nodesPerProcess: num("nodes-per-process", 25, 5),
  nodeEnv: (args["node-limits"]
    ? {}
    : { FORKD_RATE_RPS: "0", FORKD_MAX_INFLIGHT: "0", FORKD_MAX_HEAVY: "0" }) as Record<string, string>,
};
const log = (s: string) => process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${s}\n`);

const GOALS = { addedP50Ms: 2, createsPerS: 500, lostS: 15 };

async function gitCommit(): Promise<string> {
  try {
    const { stdout } = await promisify(execFile)("git", ["-C", REPO_DIR, "rev-parse", "--short", "HEAD"]);
    return stdout.trim();
  } catch {
    return "unknown";
  }
}

const cpu = (c: Record<string, number>) =>
  ["gateway", "etcd", "nodes", "client"].map((k) => c[k] ?? "—").join(" / ");
const perCore = (c: Record<string, number>) =>
  ["gateway", "etcd", "nodes"].map((k) => Math.round(1000 / (c[k] ?? NaN))).join(" / ");
const ms = (x: number | null) => (x === null ? "—" : `${r1(x)} ms`);
const yes = (b: boolean) => (b ? "yes" : "no");

function table(results: readonly SizeResult[]): string {
  const col = (f: (r: SizeResult) => string) => results.map(f).join(" | ");
  const get = (r: SizeResult) => r.latency[0];
  const post = (r: SizeResult) => r.latency[1];
  const rows: [string, (r: SizeResult) => string][] = [
    [
      "sandboxes (spread per node: min–max)",
      (r) => `${r.sandboxes} (${r.spreadByNode.min}–${r.spreadByNode.max})`,
    ],
    ["cluster up (etcd, nodes, gateway)", (r) => `${r.startS} s`],
    [
      "creates/s, one child per request",
      (r) => `**${r.singles.perSecond}**/s (p50 ${r.singles.p50Ms} ms, p99 ${r.singles.p99Ms} ms)`,
    ],
    [
      "children/s, fork -n batches",
      (r) => `**${r.batches.perSecond}**/s (n=${r.batches.batch}; p50 ${r.batches.p50Ms} ms)`,
    ],
    ["failed creates", (r) => `${r.singles.failed + r.batches.failed}`],
    [
      "GET a sandbox: gateway p50 / p99",
      (r) => `${ms(get(r)?.gateway.p50 ?? null)} / ${ms(get(r)?.gateway.p99 ?? null)}`,
    ],
    [
      "GET a sandbox: node direct p50 / p99",
      (r) => `${ms(get(r)?.direct.p50 ?? null)} / ${ms(get(r)?.direct.p99 ?? null)}`,
    ],
    [
      "**gateway adds** p50 / p99",
      (r) => `**${ms(get(r)?.added.p50 ?? null)}** / ${ms(get(r)?.added.p99 ?? null)}`,
    ],
    [
      "create one child: gateway / direct p50",
      (r) => `${ms(post(r)?.gateway.p50 ?? null)} / ${ms(post(r)?.direct.p50 ?? null)}`,
    ],
    ["CPU ms per create, one per request: gateway / etcd / nodes / client", (r) => cpu(r.cpuMsPer.single)],
    ["CPU ms per child, fork -n: gateway / etcd / nodes / client", (r) => cpu(r.cpuMsPer.batched)],
    [
      "creates/s one core would place: gateway / etcd / nodes (one per request)",
      (r) => perCore(r.cpuMsPer.single),
    ],
    ["gateway CPU ms per GET relayed", (r) => `${r.cpuMsPer.relayedGet}`],
    [
      "etcd puts / txns / deletes per create",
      (r) => `${r.etcd.perCreate.puts} / ${r.etcd.perCreate.txns} / ${r.etcd.perCreate.deletes}`,
    ],
    ["etcd raft proposals per create", (r) => `${r.etcd.perCreate.proposals}`],
    [
      "etcd bytes per create: values put / WAL",
      (r) => `${r.etcd.perCreate.putBytes} / ${r.etcd.perCreate.walBytes} B`,
    ],
    [
      "etcd client bytes per create: in / out (out: replies + watch events)",
      (r) => `${r.etcd.perCreate.clientRecvBytes} / ${r.etcd.perCreate.clientSentBytes} B`,
    ],
    [
      "etcd idle: proposals/s, client bytes out/s",
      (r) => `${r.etcd.idlePerS.proposals} / ${r.etcd.idlePerS.clientSentBytes} B`,
    ],
    ["etcd watchers; keys; db", (r) => `${r.etcd.watchers}; ${r.etcd.keys}; ${r.etcd.dbMiB} MiB`],
    [
      "gateway RSS before → after creates (per 1000 sandboxes)",
      (r) =>
        `${r.gatewayRssMiB.before} → ${r.gatewayRssMiB.after} MiB (${r.gatewayRssMiB.perThousandSandboxes} MiB)`,
    ],
    [
      "killed node: sandboxes; gone from view; **all lost**",
      (r) => `${r.lost.sandboxes}; ${ms(r.lost.nodeGoneMs)}; **${ms(r.lost.allLostMs)}**`,
    ],
  ];
  return [
    `| figure | ${results.map((r) => `${r.nodes} nodes`).join(" | ")} |`,
    `|---|${results.map(() => "---|").join("")}`,
    ...rows.map(([name, f]) => `| ${name} | ${col(f)} |`),
  ].join("\n");
}

function goals(results: readonly SizeResult[]): string {
  const lines = [
    "| goal | " + results.map((r) => `${r.nodes} nodes`).join(" | ") + " |",
    `|---|${results.map(() => "---|").join("")}`,
  ];
  const g = (name: string, f: (r: SizeResult) => boolean) =>
    lines.push(`| ${name} | ${results.map((r) => yes(f(r))).join(" | ")} |`);
  g(
    `gateway adds ≤ ${GOALS.addedP50Ms} ms p50 (GET a sandbox)`,
    (r) => (r.latency[0]?.added.p50 ?? Infinity) <= GOALS.addedP50Ms,
  );
  g(
    `≥ ${GOALS.createsPerS} creates/s (one child per request)`,
    (r) => r.singles.perSecond >= GOALS.createsPerS,
  );
  g(`≥ ${GOALS.createsPerS} children/s (fork -n)`, (r) => r.batches.perSecond >= GOALS.createsPerS);
  g(
    `dead node's sandboxes lost ≤ ${GOALS.lostS} s`,
    (r) => r.lost.allLostMs !== null && r.lost.allLostMs <= GOALS.lostS * 1000,
  );
  return lines.join("\n");
}

/** How a figure grows from the smallest size to the largest: its ratio, and the nodes' ratio. */
function growth(results: readonly SizeResult[]): string {
  const a = results[0];
  const b = results[results.length - 1];
  if (!a || !b || a === b) return "";
  const ratio = (f: (r: SizeResult) => number) => `${r2(f(b) / f(a))}×`;
  return [
    `From ${a.nodes} to ${b.nodes} nodes (${r2(b.nodes / a.nodes)}× the nodes, ${r2(b.sandboxes / a.sandboxes)}× the sandboxes):`,
    `creates/s ${ratio((r) => r.singles.perSecond)}, fork -n children/s ${ratio((r) => r.batches.perSecond)},`,
    `gateway's added p50 ${ratio((r) => Math.max(0.01, r.latency[0]?.added.p50 ?? NaN))},`,
    `etcd proposals per create ${ratio((r) => r.etcd.perCreate.proposals)}, etcd bytes out per create ${ratio((r) => r.etcd.perCreate.clientSentBytes)},`,
    `etcd idle bytes out/s ${ratio((r) => r.etcd.idlePerS.clientSentBytes)}, time to lost ${ratio((r) => r.lost.allLostMs ?? NaN)}.`,
  ].join(" ");
}

async function main(): Promise<void> {
  const t0 = performance.now();
  const commit = await gitCommit();
  const loadStart = loadavg()[0] ?? NaN;
  const results: SizeResult[] = [];
  for (const n of sizes) {
    const sandboxes = fixed ?? n * perNode;
    results.push(await runSize({ ...opts, nodes: n, sandboxes, log }));
  }
  const biggest = results[results.length - 1];
  // Over at least MIRROR_MIN_RECORDS records: a heap delta of a few dozen is GC noise (it read 0).
  const records = Math.max(biggest?.sandboxes ?? 0, MIRROR_MIN_RECORDS);
  const mirror = biggest
    ? {
        sandboxes: records,
        bytesPerSandbox: Math.round(await mirrorBytesPerSandbox(records, biggest.nodes)),
      }
    : null;
  const seconds = (performance.now() - t0) / 1000;
  const out = {
    date: new Date().toISOString(),
    commit,
    options: {
      sizes,
      perNode: fixed === null ? perNode : null,
      sandboxes: fixed,
      ...opts,
      quick: args.quick,
    },
    durationS: r1(seconds),
    loadAverage: { start: r1(loadStart), end: r1(loadavg()[0] ?? NaN) },
    results,
    mirror,
  };
  console.log(
    `forkd cluster scale (commit ${commit}, ${out.date}; ${r1(seconds / 60)} min, load ${out.loadAverage.start} → ${out.loadAverage.end})\n`,
  );
  console.log(table(results));
  console.log("\n" + goals(results));
  if (mirror)
    console.log(
      `\nThe gateway's view of ${mirror.sandboxes} sandboxes (src/cluster/view.ts, measured in this process after a full GC): ` +
        `${mirror.bytesPerSandbox} bytes of heap per sandbox.`,
    );
  const g = growth(results);
  if (g) console.log("\n" + g);
  console.log("\n" + JSON.stringify(out));
  if (args["json-out"]) await writeFile(args["json-out"], JSON.stringify(out, null, 2) + "\n");
}

main().catch((e: unknown) => {
  log(`cluster-scale failed: ${e instanceof Error ? e.stack : String(e)}`);
  process.exitCode = 1;
});
