/**
 * Rows 1 and 2 of issue 15: a code-interpreter request (fresh sandbox, one numpy cell through
 * the warm kernel's eval API, kill) against a fresh native `python3 -c` in its own namespaces,
 * interleaved; and fork → first exec reply, with the first exec alone against a warm child's.
 */
import type { PartResult, PerfCtx } from "./perf-context.js";
import { evalCell, execTrue, failureNote, forkOne, kill, poolSettler, samples } from "./ops.js";
import { nativeProgram, runNative } from "./native-python.js";
import { median, summarize } from "./stats.js";

/** Row 1: sequential requests, forkd and native alternating which goes first. */
export async function measureRequest(ctx: PerfCtx): Promise<PartResult> {
  const { api } = ctx.d;
  const tag = await ctx.base();
  const { cell, samples: samples_, settleMs } = ctx.opts;
  const program = nativeProgram(cell, "import numpy as np");
  const pool = poolSettler(api, settleMs);
  const request = async () => {
    const t0 = performance.now();
    const sb = await forkOne(api, tag);
    const t1 = performance.now();
    const value = await evalCell(api, sb.id, cell).catch(async (e: unknown) => {
      await kill(api, sb.id).catch(() => undefined);
      throw e;
    });
    const t2 = performance.now();
    await kill(api, sb.id);
    const t3 = performance.now();
    return { total: t3 - t0, fork: t1 - t0, cell: t2 - t1, kill: t3 - t2, fromPool: sb.from_pool, value };
  };
  ctx.log(`row 1: ${samples_} requests (fork + numpy cell + kill) against native python3 in namespaces`);
  const first = await request(); // unmeasured: the tag's first fork, its pool's first fill
  const native0 = await runNative(program);
  ctx.log(`  cell value: forkd ${JSON.stringify(first.value)}, native ${native0.stdout}`);
  await pool.learn(tag);
  const failures: string[] = [];
  const pairs = await samples(
    samples_,
    async (i) => {
      const runForkd = async () => {
        await pool.ready(tag);
        return request();
      };
      if (i % 2) {
        const nat = (await runNative(program)).ms;
        return { forkd: await runForkd(), nat };
      }
      const forkd = await runForkd();
      return { forkd, nat: (await runNative(program)).ms };
    },
    failures,
  );
  const forkd = pairs.map((p) => p.forkd);
  const native = pairs.map((p) => p.nat);
  const total = summarize(forkd.map((r) => r.total));
  const nat = summarize(native);
  ctx.log(`  forkd p50 ${total.p50} ms, native p50 ${nat.p50} ms`);
  const pooled = forkd.filter((r) => r.fromPool).length;
  return {
    rows: [
      {
        id: "1",
        figure: "code-interpreter request: fresh sandbox + numpy cell (eval) + kill, p50",
        unit: "ms",
        value: total.p50,
        baseline: nat.p50,
        baselineWhat: "native python3 -c in its own namespaces",
        goal: { kind: "ratio", max: 0.5 },
        today: "434 ms (native 149 ms)",
        note: `fork ${median(forkd.map((r) => r.fork)).toFixed(1)} + cell ${median(forkd.map((r) => r.cell)).toFixed(1)} + kill ${median(forkd.map((r) => r.kill)).toFixed(1)} ms (p50s); ${pooled}/${forkd.length} forks from the pool${failures.length ? "; " + failureNote(failures) : ""}`,
      },
    ],
    details: {
      failures,
      cell,
      forkd: total,
      native: nat,
      forkMs: summarize(forkd.map((r) => r.fork)),
      cellMs: summarize(forkd.map((r) => r.cell)),
      killMs: summarize(forkd.map((r) => r.kill)),
      fromPool: pooled,
    },
  };
}

/** Row 2: fork → first exec reply, the first exec alone, and a warm child's exec round trip. */
export async function measureFirstExec(ctx: PerfCtx): Promise<PartResult> {
  const { api } = ctx.d;
  const tag = await ctx.base();
  const { samples: n, settleMs } = ctx.opts;
  const pool = poolSettler(api, settleMs);
  const one = async () => {
    const sb = await forkOne(api, tag);
    const t1 = performance.now();
    await execTrue(api, sb.id).catch(async (e: unknown) => {
      await kill(api, sb.id).catch(() => undefined);
      throw e;
    });
    const firstExec = performance.now() - t1;
    await kill(api, sb.id);
    return { ready: sb.ms, firstExec, toExec: sb.ms + firstExec, fromPool: sb.from_pool };
  };
  ctx.log(`row 2: ${n} forks → first exec reply`);
  await one();
  await pool.learn(tag);
  const failures: string[] = [];
  const runs = await samples(
    n,
    async () => {
      await pool.ready(tag);
      return one();
    },
    failures,
  );
  // A warm child: the exec path already translated.
  const warm = await forkOne(api, tag);
  for (let i = 0; i < 3; i++) await execTrue(api, warm.id);
  const warmRtt: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await execTrue(api, warm.id);
    warmRtt.push(performance.now() - t);
  }
  await kill(api, warm.id);
  const toExec = summarize(runs.map((r) => r.toExec));
  const ready = summarize(runs.map((r) => r.ready));
  const first = summarize(runs.map((r) => r.firstExec));
  const rtt = summarize(warmRtt);
  ctx.log(
    `  fork → first exec p50 ${toExec.p50} ms (ready ${ready.p50}, first exec ${first.p50}, warm exec ${rtt.p50})`,
  );
  const pooled = runs.filter((r) => r.fromPool).length;
  return {
    rows: [
      {
        id: "2",
        figure: "fork → first exec reply, p50",
        unit: "ms",
        value: toExec.p50,
        baseline: Math.round((ready.p50 + rtt.p50) * 10) / 10,
        baselineWhat: "fork → ready + a warm child's exec",
        goal: { kind: "max", value: 60 },
        today: "367 ms",
        note: `fork → agent ready p50 ${ready.p50} ms; ${pooled}/${runs.length} forks from the pool${failures.length ? "; " + failureNote(failures) : ""}`,
      },
      {
        id: "2b",
        figure: "the first exec in a fresh child alone, p50",
        unit: "ms",
        value: first.p50,
        baseline: rtt.p50,
        baselineWhat: "exec round trip, warm child",
        goal: { kind: "none" },
        today: "261 ms",
      },
    ],
    details: {
      forkToFirstExec: toExec,
      forkToReady: ready,
      firstExec: first,
      warmExecRtt: rtt,
      fromPool: pooled,
    },
  };
}
