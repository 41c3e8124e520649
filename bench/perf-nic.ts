/**
 * Row 9 of issue 15: fork → agent ready of a snapshot with a NIC (the base, as every snapshot
 * has one) against its NIC-less twin made in the same run (the base's creation request plus
 * `--nicless`, by default `{"nic": false}`), interleaved. A daemon that cannot make one says so
 * in the row (400), and the NIC figure is still measured.
 */
import type { PartResult, PerfCtx } from "./perf-context.js";
import { baseBody } from "./perf-context.js";
import {
  createSnapshot,
  failureNote,
  forkOne,
  kill,
  poolSettler,
  samples as samplesOf,
  withChild,
} from "./ops.js";
import type { SnapshotMetaView } from "./ops.js";
import { errorMessage } from "../src/util/errors.js";
import { summarize } from "./stats.js";

const TAG = "perf-nicless";

export async function measureNic(ctx: PerfCtx): Promise<PartResult> {
  const { api } = ctx.d;
  const base = await ctx.base();
  const { samples, settleMs, nicless } = ctx.opts;
  ctx.log(`row 9: snapshot ${TAG} (${JSON.stringify(nicless)}), ${samples} forks of each, interleaved`);
  let twin: SnapshotMetaView | null = null;
  let why = "";
  try {
    twin = await createSnapshot(api, { ...baseBody(ctx.opts, TAG), ...nicless });
    if (twin.nic) {
      why = `the snapshot made with ${JSON.stringify(nicless)} still has a NIC`;
      await api("DELETE", `/v1/snapshots/${TAG}`);
      twin = null;
    }
  } catch (e) {
    why = `this daemon makes no NIC-less snapshot (${errorMessage(e).slice(0, 160)})`;
  }
  const baseMeta = await api<SnapshotMetaView>("GET", `/v1/snapshots/${base}`);
  const tags = twin ? [base, TAG] : [base];
  const pool = poolSettler(api, settleMs);
  for (const t of tags) {
    await kill(api, (await forkOne(api, t)).id);
    await pool.learn(t);
  }
  const ms: Record<string, number[]> = Object.fromEntries(tags.map((t) => [t, []]));
  const readyMs: Record<string, number[]> = Object.fromEntries(tags.map((t) => [t, []]));
  const failures: string[] = [];
  await samplesOf(
    samples,
    async (i) => {
      for (const t of i % 2 ? [...tags].reverse() : tags) {
        await pool.ready(t);
        const sb = await withChild(api, t, async (c) => c);
        ms[t]?.push(sb.ms);
        readyMs[t]?.push(sb.timings.ready_ms);
      }
    },
    failures,
  );
  if (twin) await api("DELETE", `/v1/snapshots/${TAG}`);
  const withNic = summarize(ms[base] ?? []);
  const without = twin ? summarize(ms[TAG] ?? []) : null;
  const daemonReady = (t: string) => summarize(readyMs[t] ?? []).p50;
  return {
    rows: [
      {
        id: "9",
        figure: "fork → agent ready with a NIC, p50",
        unit: "ms",
        value: withNic.p50,
        baseline: without?.p50 ?? null,
        baselineWhat: "a NIC-less snapshot",
        goal: { kind: "same", tolerance: 5, tolerancePct: 5 },
        today: "+20 ms",
        note: [
          baseMeta.nic ? "" : "the base snapshot has no NIC",
          why,
          failureNote(failures),
          `the daemon's ready phase p50: ${daemonReady(base)} ms${twin ? ` / ${daemonReady(TAG)} ms NIC-less` : ""}`,
        ]
          .filter(Boolean)
          .join("; "),
      },
    ],
    details: { withNic, without, niclessRequest: nicless, unavailable: why || null },
  };
}
