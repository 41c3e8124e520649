/**
 * Issue 15's table in one command: every figure measured against a real daemon (its own
 * process and throwaway data dir, the shared guest image cache) over the REST API only, each
 * beside its baseline from the same run, printed as a Markdown table and JSON.
 *
 *   node dist/bench/perf.js [--only 1,2,5] [--smoke] [--json-out FILE] [--samples 15]
 *     [--branch-samples 5] [--fanout 100] [--memory-mib 512] [--pause-memory-mib 1024]
 *     [--pause-write-mib 256] [--tree-branches 12] [--tree-memory-mib 256] [--cell CODE]
 *     [--nicless JSON] [--idle-ms 3000] [--settle-ms 3000] [--env K=V ...] [--data-parent DIR]
 *
 * Rows (see `issues show 15`): 1 request vs native python3, 2 fork → first exec, 3 fan-out,
 * 4 idle PSS, 5 BRANCH in a chain vs of a base fork (+ deep vs base forks), 6 new disk per
 * branch, 7 BRANCH pause vs what was written, 8 idle VMMs after a tree search, 9 NIC vs
 * NIC-less. `--smoke` shrinks every size and count for a quick check that it all runs.
 */
import { execFile } from "node:child_process";
import { copyFile, statfs, writeFile } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs, promisify } from "node:util";
import { REPO_DIR } from "../src/host/paths.js";
import { errorMessage } from "../src/util/errors.js";
import { benchDataDir, finishDaemon, startDaemon } from "./daemon.js";
import { BASE_TAG, perfContext } from "./perf-context.js";
import type { PartResult, PerfCtx, PerfOptions } from "./perf-context.js";
import { formatTable, parseOnly, verdict } from "./perf-table.js";
import type { PerfRow } from "./perf-table.js";
import { measureFirstExec, measureRequest } from "./perf-request.js";
import { measureFanout } from "./perf-fanout.js";
import { measureChain } from "./perf-chain.js";
import { measurePause } from "./perf-pause.js";
import { measureTree } from "./perf-tree.js";
import { measureNic } from "./perf-nic.js";
import { r1, r2 } from "./stats.js";

const DEFAULT_CELL =
  "rng = np.random.default_rng(0)\nx = rng.standard_normal(100_000)\nfloat(x.mean() + x.std())";

const { values: args } = parseArgs({
  options: {
    only: { type: "string" },
    smoke: { type: "boolean", default: false },
    "json-out": { type: "string" },
    samples: { type: "string" },
    "branch-samples": { type: "string" },
    fanout: { type: "string" },
    "idle-ms": { type: "string" },
    "settle-ms": { type: "string" },
    "memory-mib": { type: "string" },
    cell: { type: "string" },
    "chain-write-mib": { type: "string" },
    "pause-memory-mib": { type: "string" },
    "pause-write-mib": { type: "string" },
    "pause-base-write-mib": { type: "string" },
    "tree-branches": { type: "string" },
    "tree-memory-mib": { type: "string" },
    nicless: { type: "string" },
    env: { type: "string", multiple: true },
    "data-parent": { type: "string" },
  },
});

/** A numeric option: given, else its smoke or full-run default. */
const num = (name: keyof typeof args, full: number, smoke: number): number => {
  const v = args[name];
  const n = typeof v === "string" ? Number(v) : args.smoke ? smoke : full;
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${name}: ${String(v)} is not a positive number`);
  return n;
};

const opts: PerfOptions = {
  samples: num("samples", 15, 3),
  branchSamples: num("branch-samples", 5, 2),
  fanoutN: num("fanout", 100, 10),
  idleMs: num("idle-ms", 3000, 1000),
  settleMs: num("settle-ms", 3000, 2000),
  memoryMiB: num("memory-mib", 512, 256),
  cell: args.cell ?? DEFAULT_CELL,
  chainWriteMiB: num("chain-write-mib", 1, 1),
  pauseMemoryMiB: num("pause-memory-mib", 1024, 512),
  pauseWriteMiB: num("pause-write-mib", 256, 32),
  pauseBaseWriteMiB: num("pause-base-write-mib", 1, 1),
  treeBranches: num("tree-branches", 12, 4),
  treeMemoryMiB: num("tree-memory-mib", 256, 256),
  nicless: JSON.parse(args.nicless ?? '{"nic": false}') as Record<string, unknown>,
};
const only = parseOnly(args.only);
const daemonEnv = Object.fromEntries(
  (args.env ?? []).map((kv) => {
    const i = kv.indexOf("=");
    if (i <= 0) throw new Error(`--env: "${kv}" is not NAME=VALUE`);
    return [kv.slice(0, i), kv.slice(i + 1)];
  }),
);
const log = (s: string) => process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${s}\n`);

/** The parts in the order they run: the base snapshot's first, the ones with their own snapshots last. */
interface Part {
  rows: number[];
  ids: string[];
  run: (ctx: PerfCtx) => Promise<PartResult>;
  /** The most host disk (MiB) it may add at once on today's main (full memory images per snapshot). */
  diskMiB: (o: PerfOptions) => number;
}
const PARTS: Part[] = [
  { rows: [1], ids: ["1"], run: measureRequest, diskMiB: (o) => o.memoryMiB },
  { rows: [2], ids: ["2", "2b"], run: measureFirstExec, diskMiB: (o) => o.memoryMiB },
  { rows: [3, 4], ids: ["3", "4"], run: measureFanout, diskMiB: (o) => o.memoryMiB },
  { rows: [9], ids: ["9"], run: measureNic, diskMiB: (o) => 2 * o.memoryMiB },
  {
    rows: [5, 6],
    ids: ["5", "5b", "6"],
    run: measureChain,
    diskMiB: (o) => (o.branchSamples + 2) * o.memoryMiB,
  },
  { rows: [8], ids: ["8"], run: measureTree, diskMiB: (o) => (o.treeBranches + 1) * o.treeMemoryMiB },
  { rows: [7], ids: ["7"], run: measurePause, diskMiB: (o) => 2 * o.pauseMemoryMiB },
];
/** Free disk kept for everyone else on the machine: a part that would leave less is skipped. */
const DISK_MARGIN_MIB = 1024;

async function freeMiB(dir: string): Promise<number> {
  const s = await statfs(dir);
  return (s.bavail * s.bsize) / 2 ** 20;
}
const USES_BASE = new Set([1, 2, 3, 4, 5, 6, 9]);

const failedRow = (id: string, reason: string, figure = "(failed)"): PerfRow => ({
  id,
  figure,
  unit: "ms",
  value: null,
  baseline: null,
  baselineWhat: "",
  goal: { kind: "none" },
  today: "",
  note: reason,
});

async function gitCommit(): Promise<string> {
  try {
    const { stdout } = await promisify(execFile)("git", ["-C", REPO_DIR, "rev-parse", "--short", "HEAD"]);
    return stdout.trim();
  } catch {
    return "unknown";
  }
}

async function main(): Promise<void> {
  const t0 = performance.now();
  const loadStart = loadavg()[0] ?? NaN;
  const commit = await gitCommit(); // the build being measured: read before the run, not after it
  const dataDir = await benchDataDir("forkd-bench-perf", args["data-parent"] ?? tmpdir());
  log(`data dir ${dataDir}; rows ${[...only].join(",")}${args.smoke ? " (smoke sizes)" : ""}`);
  const d = await startDaemon(dataDir, daemonEnv);
  const ctx = perfContext(d, opts, log);
  const rows: PerfRow[] = [];
  const details: Record<string, unknown> = {};
  let failed = false;
  let version: unknown = null;
  try {
    version = await d.api("GET", "/v1/version");
    const selected = PARTS.filter((p) => p.rows.some((r) => only.has(r)));
    const lastBaseUser = selected.filter((p) => p.rows.some((r) => USES_BASE.has(r))).at(-1);
    for (const part of selected) {
      const need = part.diskMiB(opts) + DISK_MARGIN_MIB;
      const free = await freeMiB(dataDir);
      if (free < need) {
        const why = `skipped: it may need ${Math.round(need)} MiB of disk, ${Math.round(free)} MiB free`;
        log(`rows ${part.ids.join(", ")} ${why}`);
        rows.push(...part.ids.map((id) => failedRow(id, why, "(not run)")));
      } else {
        try {
          const r = await part.run(ctx);
          rows.push(...r.rows.filter((row) => only.has(Number.parseInt(row.id, 10))));
          details[`rows ${part.ids.join(", ")}`] = r.details;
        } catch (e) {
          failed = true;
          log(`rows ${part.ids.join(", ")} failed: ${e instanceof Error ? e.stack : String(e)}`);
          rows.push(...part.ids.map((id) => failedRow(id, errorMessage(e).slice(0, 300))));
        }
      }
      if (part === lastBaseUser) {
        // Free the disk before the parts that make their own snapshots.
        await d.api("DELETE", `/v1/snapshots/${BASE_TAG}?cascade=1`).catch(() => undefined);
      }
    }
  } finally {
    const keptLog = join(tmpdir(), `forkd-bench-perf-${Date.now()}.daemon.log`);
    if (failed) await copyFile(join(dataDir, "daemon.log"), keptLog).catch(() => undefined);
    await finishDaemon(d);
    if (failed) log(`the daemon's log is kept in ${keptLog}`);
  }
  const seconds = (performance.now() - t0) / 1000;
  const v = version as { version?: string; accel?: { accel?: string }; qemu?: { version?: string } } | null;
  const result = {
    date: new Date().toISOString(),
    commit,
    forkd: v?.version ?? null,
    accel: v?.accel?.accel ?? null,
    qemu: v?.qemu?.version ?? null,
    options: { ...opts, only: [...only], smoke: args.smoke, env: daemonEnv },
    durationS: r1(seconds),
    loadAverage: { start: r1(loadStart), end: r1(loadavg()[0] ?? NaN) },
    rows: rows.map((row) => {
      const round = (x: number | null) => (x === null ? null : row.unit === "s" ? r2(x) : r1(x));
      const v = verdict(row);
      return {
        ...row,
        value: round(row.value),
        baseline: round(row.baseline),
        ratio: v.ratio === null ? null : r2(v.ratio),
        met: v.met,
      };
    }),
    details,
  };
  console.log(
    `forkd issue 15 figures (${result.accel ?? "?"}, commit ${result.commit}, ${result.date}; ` +
      `${r1(seconds / 60)} min, load ${result.loadAverage.start} → ${result.loadAverage.end})\n`,
  );
  console.log(formatTable(rows));
  console.log("\n" + JSON.stringify(result));
  if (args["json-out"]) await writeFile(args["json-out"], JSON.stringify(result, null, 2) + "\n");
  if (failed) process.exitCode = 1;
}

main().catch((e: unknown) => {
  log(`perf failed: ${e instanceof Error ? e.stack : String(e)}`);
  process.exitCode = 1;
});
