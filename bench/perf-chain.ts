/**
 * Rows 5 and 6 of issue 15: BRANCH in a chain (branch a child, fork a child of the branch, let
 * it write, branch again...) interleaved with branches of a fork of the base snapshot, each
 * child having written the same ~1 MiB: time until the branch is forkable (the reply with
 * `wait`), the disk it added (du of the data dir's snapshots, each inode once; and the API's
 * physical_bytes), then fork → ready of the deepest branch against the base.
 */
import { join } from "node:path";
import type { PartResult, PerfCtx } from "./perf-context.js";
import {
  branch,
  evalCell,
  failureNote,
  forkOne,
  kill,
  poolSettler,
  samples as samplesOf,
  sleep,
  withChild,
  writeCell,
} from "./ops.js";
import { diskUsageBytes } from "./host-measures.js";
import { r1, summarize } from "./stats.js";

const MiB = 2 ** 20;

interface Step {
  tag: string;
  ms: number;
  pauseMs: number;
  privateMiB: number;
  newDiskMiB: number;
  physicalMiB: number;
}

export async function measureChain(ctx: PerfCtx): Promise<PartResult> {
  const { api, dataDir } = ctx.d;
  const base = await ctx.base();
  const { branchSamples: len, chainWriteMiB, samples, settleMs } = ctx.opts;
  const snapshotsDir = join(dataDir, "snapshots");
  const du = () => diskUsageBytes([snapshotsDir]);

  const branchOf = async (parent: string, tag: string, k: number): Promise<Step> => {
    const child = await forkOne(api, parent);
    await evalCell(api, child.id, writeCell(`_w${k}`, chainWriteMiB));
    const before = await du();
    const b = await branch(api, child.id, tag);
    const added = (await du()) - before;
    await kill(api, child.id);
    const info = await api<{ physical_bytes: number }>("GET", `/v1/snapshots/${b.tag}/info`);
    return {
      tag: b.tag,
      ms: b.ms,
      pauseMs: b.pause_ms,
      privateMiB: b.private_bytes / MiB,
      newDiskMiB: added / MiB,
      physicalMiB: info.physical_bytes / MiB,
    };
  };

  ctx.log(
    `rows 5-6: a chain of ${len} branches and ${len} branches of base forks, interleaved (${chainWriteMiB} MiB written each)`,
  );
  const duStart = await du();
  const chain: Step[] = [];
  const fromBase: Step[] = [];
  let parent = base;
  for (let i = 0; i < len; i++) {
    const c = await branchOf(parent, `perf-chain-${i + 1}`, i);
    chain.push(c);
    parent = c.tag;
    const b = await branchOf(base, `perf-basebr-${i + 1}`, i);
    fromBase.push(b);
    await api("DELETE", `/v1/snapshots/${b.tag}`);
    ctx.log(
      `  ${i + 1}: chain ${r1(c.ms)} ms (+${r1(c.newDiskMiB)} MiB), base fork ${r1(b.ms)} ms (+${r1(b.newDiskMiB)} MiB)`,
    );
  }
  await sleep(2000); // anything a branch finishes in the background lands on disk meanwhile
  const settledPerBranch = ((await du()) - duStart) / MiB / Math.max(1, len);

  // Fork → ready of the deepest branch against the base, interleaved.
  const deepest = parent;
  const pool = poolSettler(api, settleMs);
  const firstDeep = await forkOne(api, deepest);
  await kill(api, firstDeep.id);
  await pool.learn(deepest);
  await pool.learn(base);
  const deep: number[] = [];
  const flat: number[] = [];
  const failures: string[] = [];
  await samplesOf(
    samples,
    async (i) => {
      const order = (
        i % 2
          ? [
              [base, flat],
              [deepest, deep],
            ]
          : [
              [deepest, deep],
              [base, flat],
            ]
      ) as [string, number[]][];
      for (const [tag, out] of order) {
        await pool.ready(tag);
        out.push((await withChild(api, tag, async (c) => c)).ms);
      }
    },
    failures,
  );
  if (chain[0]) await api("DELETE", `/v1/snapshots/${chain[0].tag}?cascade=1`);

  const s = (xs: Step[], k: keyof Omit<Step, "tag">) => summarize(xs.map((x) => x[k]));
  const chainMs = s(chain, "ms");
  const baseMs = s(fromBase, "ms");
  const deepS = summarize(deep);
  const flatS = summarize(flat);
  const newDisk = s(chain, "newDiskMiB");
  const baseDisk = s(fromBase, "newDiskMiB");
  const figure = Math.max(newDisk.p50, settledPerBranch);
  return {
    rows: [
      {
        id: "5",
        figure: `BRANCH until forkable, ${ctx.opts.memoryMiB} MiB guest, ~${chainWriteMiB} MiB written, p50 of ${len} in a chain`,
        unit: "ms",
        value: chainMs.p50,
        baseline: baseMs.p50,
        baselineWhat: "a branch of a base-snapshot fork",
        goal: { kind: "max", value: 300 },
        today: "2.6 s",
        note: `pause p50 ${s(chain, "pauseMs").p50} ms in the chain, ${s(fromBase, "pauseMs").p50} ms from the base; private ${s(chain, "privateMiB").p50} / ${s(fromBase, "privateMiB").p50} MiB`,
      },
      {
        id: "5b",
        figure: `fork → ready of the deepest branch (depth ${len}), p50`,
        unit: "ms",
        value: deepS.p50,
        baseline: flatS.p50,
        baselineWhat: "fork → ready of the base",
        goal: { kind: "same", tolerance: 5, tolerancePct: 10 },
        today: "flat in depth (pool off)",
        note: `the deepest branch's first fork: ${r1(firstDeep.ms)} ms${failures.length ? "; " + failureNote(failures) : ""}`,
      },
      {
        id: "6",
        figure: "new disk per branch (du of what the branch added)",
        unit: "MiB",
        value: figure,
        baseline: baseDisk.p50,
        baselineWhat: "a branch of a base-snapshot fork",
        goal: { kind: "max", value: 32 },
        today: "512 MiB",
        note: `chain: p50 ${newDisk.p50} MiB at the reply, ${r1(settledPerBranch)} MiB per branch after all settled (the larger is the figure); API physical_bytes p50 ${s(chain, "physicalMiB").p50} MiB`,
      },
    ],
    details: {
      chain,
      fromBase,
      untilForkable: { chain: chainMs, fromBase: baseMs },
      newDiskMiB: { chain: newDisk, fromBase: baseDisk, chainSettledPerBranch: r1(settledPerBranch) },
      forkToReady: { deepest: deepS, base: flatS, deepestFirstMs: r1(firstDeep.ms) },
    },
  };
}
