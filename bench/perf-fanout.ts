/**
 * Rows 3 and 4 of issue 15: N children forked in one request until all reply, against N
 * sequential forks (N × the fork → ready p50 of this run); and the idle children's PSS
 * (/proc/PID/smaps_rollup of their VMMs) against one idle child alone.
 */
import type { PartResult, PerfCtx } from "./perf-context.js";
import { forkOne, kill, poolSettler, samples, sleep, withChild } from "./ops.js";
import type { SandboxView } from "./ops.js";
import { memAvailableKiB, pssKiB } from "./host-measures.js";
import { r1, summarize } from "./stats.js";

export async function measureFanout(ctx: PerfCtx): Promise<PartResult> {
  const { api } = ctx.d;
  const tag = await ctx.base();
  const { fanoutN: n, idleMs, settleMs } = ctx.opts;
  const pool = poolSettler(api, settleMs);
  const seqSamples = Math.max(3, Math.min(5, ctx.opts.samples));

  ctx.log(`rows 3-4: ${seqSamples} sequential forks, one idle child, then ${n} at once`);
  await kill(api, (await forkOne(api, tag)).id);
  await pool.learn(tag);
  const failures: string[] = [];
  const seq = await samples(
    seqSamples,
    async () => {
      await pool.ready(tag);
      return (await withChild(api, tag, async (c) => c)).ms;
    },
    failures,
  );
  await pool.ready(tag);
  const alone = await forkOne(api, tag);
  await sleep(idleMs);
  const aloneMiB = (await pssKiB(alone.pid)) / 1024;
  await kill(api, alone.id);
  await pool.ready(tag);

  const before = await memAvailableKiB();
  const t0 = performance.now();
  const r = await api<{ sandboxes: SandboxView[]; failures: { message: string }[] }>(
    "POST",
    "/v1/sandboxes",
    {
      snapshot_tag: tag,
      n,
    },
  );
  const wallMs = performance.now() - t0;
  const ok = r.sandboxes.length;
  ctx.log(
    `  ${ok}/${n} replied in ${r1(wallMs)} ms${r.failures.length ? `; first failure: ${r.failures[0]?.message}` : ""}`,
  );
  await sleep(idleMs);
  const pss = await Promise.all(r.sandboxes.map((s) => pssKiB(s.pid)));
  const after = await memAvailableKiB();
  await Promise.all(r.sandboxes.map((s) => kill(api, s.id).catch(() => undefined)));
  const pssPerChild = pss.reduce((a, b) => a + b, 0) / 1024 / Math.max(1, ok);
  const memAvailPerChild = (before - after) / 1024 / Math.max(1, ok);
  const seqSum = summarize(seq);
  const allOk = ok === n;
  return {
    rows: [
      {
        id: "3",
        figure: `${n} children, all replying (one request, wall)`,
        unit: "s",
        value: allOk ? wallMs / 1000 : null,
        baseline: (n * seqSum.p50) / 1000,
        baselineWhat: `${n} × fork → ready p50 (sequential)`,
        goal: n === 100 ? { kind: "max", value: 8 } : { kind: "none" },
        today: "12.8 s",
        note: allOk
          ? undefined
          : `only ${ok}/${n} children came up (${r1(wallMs / 1000)} s): ${r.failures[0]?.message ?? ""}`,
      },
      {
        id: "4",
        figure: `idle child PSS at N=${n}`,
        unit: "MiB",
        value: ok ? pssPerChild : null,
        baseline: aloneMiB,
        baselineWhat: "one idle child alone",
        goal: n === 100 ? { kind: "max", value: 12 } : { kind: "none" },
        today: "20 MiB",
        note: `MemAvailable fell by ${r1(memAvailPerChild)} MiB per child (the machine is shared: indicative)`,
      },
    ],
    details: {
      n,
      ok,
      failures: r.failures.length,
      wallMs: r1(wallMs),
      forkToReadySequential: seqSum,
      sequentialFailures: failures,
      pssMiBPerChild: r1(pssPerChild),
      pssMiBAlone: r1(aloneMiB),
      memAvailableMiBPerChild: r1(memAvailPerChild),
      fromPool: r.sandboxes.filter((s) => s.from_pool).length,
    },
  };
}
