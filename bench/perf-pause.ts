/**
 * Row 7 of issue 15: the pause of a BRANCH (the daemon's `pause_ms`) of a child of a 1 GiB
 * guest that wrote 256 MiB, against one that wrote ~1 MiB (flat in what was written?), both
 * sources alive at once and their branches interleaved, each branch deleted after.
 */
import type { PartResult, PerfCtx } from "./perf-context.js";
import { branch, createSnapshot, evalCell, forkOne, kill, writeCell } from "./ops.js";
import { r1, summarize } from "./stats.js";

const TAG = "perf-big";

interface Run {
  pause: number;
  ms: number;
  privateMiB: number;
}

export async function measurePause(ctx: PerfCtx): Promise<PartResult> {
  const { api } = ctx.d;
  const { pauseMemoryMiB, pauseWriteMiB, pauseBaseWriteMiB, branchSamples } = ctx.opts;
  ctx.log(
    `row 7: snapshot ${TAG} (${pauseMemoryMiB} MiB), sources writing ${pauseWriteMiB} and ${pauseBaseWriteMiB} MiB`,
  );
  await createSnapshot(api, { tag: TAG, memory_mib: pauseMemoryMiB, warm_eval: "import os" });
  const big = await forkOne(api, TAG);
  const small = await forkOne(api, TAG);
  await evalCell(api, big.id, writeCell("_w", pauseWriteMiB));
  await evalCell(api, small.id, writeCell("_w", pauseBaseWriteMiB));
  const runs: Record<"big" | "small", Run[]> = { big: [], small: [] };
  for (let i = 0; i < branchSamples; i++) {
    const order = i % 2 ? (["small", "big"] as const) : (["big", "small"] as const);
    for (const which of order) {
      const src = which === "big" ? big : small;
      const b = await branch(api, src.id, `perf-pause-${which}-${i}`);
      runs[which].push({ pause: b.pause_ms, ms: b.ms, privateMiB: b.private_bytes / 2 ** 20 });
      await api("DELETE", `/v1/snapshots/${b.tag}`);
    }
    ctx.log(
      `  ${i + 1}: pause ${r1(runs.big.at(-1)?.pause ?? NaN)} ms (${pauseWriteMiB} MiB) / ${r1(runs.small.at(-1)?.pause ?? NaN)} ms (${pauseBaseWriteMiB} MiB)`,
    );
  }
  await kill(api, big.id);
  await kill(api, small.id);
  await api("DELETE", `/v1/snapshots/${TAG}`);
  const bigS = summarize(runs.big.map((r) => r.pause));
  const smallS = summarize(runs.small.map((r) => r.pause));
  const priv = (xs: Run[]) => r1(summarize(xs.map((r) => r.privateMiB)).p50);
  return {
    rows: [
      {
        id: "7",
        figure: `BRANCH pause, ${pauseWriteMiB} MiB written, ${pauseMemoryMiB} MiB guest, p50 of ${branchSamples}`,
        unit: "ms",
        value: bigS.p50,
        baseline: smallS.p50,
        baselineWhat: `the pause with ~${pauseBaseWriteMiB} MiB written`,
        goal: { kind: "max", value: 30 },
        today: "98.5 ms",
        note: `private ${priv(runs.big)} / ${priv(runs.small)} MiB; branch until ready p50 ${summarize(runs.big.map((r) => r.ms)).p50} / ${summarize(runs.small.map((r) => r.ms)).p50} ms`,
      },
    ],
    details: {
      pauseMs: { written: bigS, baseline: smallS },
      untilReadyMs: {
        written: summarize(runs.big.map((r) => r.ms)),
        baseline: summarize(runs.small.map((r) => r.ms)),
      },
      privateMiB: { written: priv(runs.big), baseline: priv(runs.small) },
    },
  };
}
