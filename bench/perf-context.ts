/** What every part of bench/perf.ts gets: the daemon, the options, a log, the shared base snapshot. */
import type { BenchDaemon } from "./daemon.js";
import { createSnapshot } from "./ops.js";
import type { PerfRow } from "./perf-table.js";

export interface PerfOptions {
  /** Sequential samples of the fork rows (1, 2, 5's forks, 9). */
  samples: number;
  /** Branches per side of the branch rows (5, 7). */
  branchSamples: number;
  fanoutN: number;
  /** How long children sit idle before their PSS is read. */
  idleMs: number;
  /** The longest wait for a pool to refill before a sample. */
  settleMs: number;
  memoryMiB: number;
  cell: string;
  chainWriteMiB: number;
  pauseMemoryMiB: number;
  pauseWriteMiB: number;
  pauseBaseWriteMiB: number;
  treeBranches: number;
  treeMemoryMiB: number;
  /** Fields added to the base snapshot's creation to make its NIC-less twin (row 9). */
  nicless: Record<string, unknown>;
}

export interface PerfCtx {
  d: BenchDaemon;
  opts: PerfOptions;
  log: (s: string) => void;
  /** Creates the base snapshot on first use (512 MiB, numpy imported in the warm kernel). */
  base(): Promise<string>;
}

export const BASE_TAG = "perf-base";
/** The base snapshot's warm-up: what a code-interpreter template has ready. */
export const BASE_WARM_EVAL = "import numpy as np\nimport os";

/** The base snapshot's creation request (its NIC-less twin adds `opts.nicless`). */
export const baseBody = (opts: PerfOptions, tag = BASE_TAG) => ({
  tag,
  memory_mib: opts.memoryMiB,
  warm_eval: BASE_WARM_EVAL,
});

export function perfContext(d: BenchDaemon, opts: PerfOptions, log: (s: string) => void): PerfCtx {
  let made: Promise<string> | null = null;
  return {
    d,
    opts,
    log,
    base() {
      made ??= (async () => {
        log(`snapshot ${BASE_TAG}: ${opts.memoryMiB} MiB guest, numpy warm`);
        const meta = await createSnapshot(d.api, baseBody(opts));
        log(`  boot ${Math.round(meta.timings.boot_ms)} ms`);
        return BASE_TAG;
      })();
      return made;
    },
  };
}

/** What one part of the benchmark hands back: its rows of the table and its raw figures. */
export interface PartResult {
  rows: PerfRow[];
  details: Record<string, unknown>;
}
