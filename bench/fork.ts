/**
 * Fork benchmark: every figure measured in this one run, against a real daemon (its own
 * process, a throwaway data dir) over the REST API. Prints a table and JSON.
 *
 *   node dist/bench/fork.js [--samples 20] [--fanout 10,50,100] [--cold 3] [--json-out FILE]
 */
import { writeFile } from "node:fs/promises";
import { parseArgs } from "node:util";
import { benchDataDir, finishDaemon, startDaemon } from "./daemon.js";
import { memAvailableKiB, pssKiB } from "./host-measures.js";
import { pct, r1 } from "./stats.js";

const { values: args } = parseArgs({
  options: {
    samples: { type: "string", default: "20" },
    fanout: { type: "string", default: "10,50,100" },
    cold: { type: "string", default: "3" },
    "json-out": { type: "string" },
    "memory-mib": { type: "string", default: "512" },
  },
});
const SAMPLES = Number(args.samples);
const FANOUT = args.fanout
  .split(",")
  .map(Number)
  .filter((n) => n > 0);
const COLD = Number(args.cold);

const median = (xs: number[]) => pct(xs, 50);
const log = (s: string) => process.stderr.write(s + "\n");

interface View {
  id: string;
  pid: number;
}

async function main(): Promise<void> {
  const dataDir = await benchDataDir("forkd-bench");
  process.on("unhandledRejection", (e) => log(`unhandled rejection: ${String(e)}`));
  const daemon = await startDaemon(dataDir);
  const api = daemon.api;
  let ok = false;
  try {
    const health = await api<{ accel: string; accel_reason: string }>("GET", "/v1/health");
    log(`accelerator: ${health.accel} (${health.accel_reason})`);
    const memoryMiB = Number(args["memory-mib"]);
    const snapBody = (tag: string) => ({
      tag,
      memory_mib: memoryMiB,
      warm_eval: "import numpy as np\nwarm = np.arange(10)",
    });

    // Cold boot of the same VM to first agent reply (with the warm interpreter up): the parent boot.
    const coldMs: number[] = [];
    for (let i = 0; i < Math.max(1, COLD); i++) {
      const tag = i === 0 ? "bench" : `bench-cold-${i}`;
      log(`cold boot ${i + 1}/${Math.max(1, COLD)} (snapshot ${tag})`);
      const meta = await api<{ timings: { boot_ms: number } }>("POST", "/v1/snapshots", snapBody(tag));
      coldMs.push(meta.timings.boot_ms);
      if (i > 0) await api("DELETE", `/v1/snapshots/${tag}`);
    }

    // Single fork to first exec reply.
    log(`single fork -> first exec reply, ${SAMPLES} samples`);
    const forkReady: number[] = [];
    const forkToExec: number[] = [];
    const firstExec: number[] = [];
    for (let i = 0; i < SAMPLES; i++) {
      const t0 = performance.now();
      const r = await api<{ sandboxes: (View & { timings: { total_ms: number } })[] }>(
        "POST",
        "/v1/sandboxes",
        { snapshot_tag: "bench", n: 1 },
      );
      const t1 = performance.now();
      const sb = r.sandboxes[0]!;
      await api("POST", `/v1/sandboxes/${sb.id}/exec`, { cmd: ["true"] });
      const t2 = performance.now();
      forkReady.push(t1 - t0);
      forkToExec.push(t2 - t0);
      firstExec.push(t2 - t1);
      await api("DELETE", `/v1/sandboxes/${sb.id}`);
    }

    // Round trips on a warm child.
    log("exec / eval round trips");
    const one = (await api<{ sandboxes: View[] }>("POST", "/v1/sandboxes", { snapshot_tag: "bench", n: 1 }))
      .sandboxes[0]!;
    const execRtt: number[] = [];
    const evalRtt: number[] = [];
    const freshPy: number[] = [];
    for (let i = 0; i < 3; i++) await api("POST", `/v1/sandboxes/${one.id}/exec`, { cmd: ["true"] });
    for (let i = 0; i < SAMPLES; i++) {
      let t = performance.now();
      await api("POST", `/v1/sandboxes/${one.id}/exec`, { cmd: ["true"] });
      execRtt.push(performance.now() - t);
      t = performance.now();
      await api("POST", `/v1/sandboxes/${one.id}/eval`, { code: "int(warm.sum())" });
      evalRtt.push(performance.now() - t);
    }
    for (let i = 0; i < Math.min(5, SAMPLES); i++) {
      const t = performance.now();
      await api("POST", `/v1/sandboxes/${one.id}/exec`, { cmd: ["python3", "-c", "import numpy"] });
      freshPy.push(performance.now() - t);
    }
    await api("DELETE", `/v1/sandboxes/${one.id}`);

    // Fan-out and memory per idle child.
    const fan: Record<
      string,
      { wallMs: number; ok: number; pssMiBPerChild: number; memAvailMiBPerChild: number }
    > = {};
    for (const n of FANOUT) {
      log(`fan-out n=${n}`);
      const before = await memAvailableKiB();
      const t0 = performance.now();
      const r = await api<{ sandboxes: View[]; failures: unknown[] }>("POST", "/v1/sandboxes", {
        snapshot_tag: "bench",
        n,
      });
      const wallMs = performance.now() - t0;
      await new Promise((res) => setTimeout(res, 3000)); // idle
      const pss = (await Promise.all(r.sandboxes.map((s) => pssKiB(s.pid)))).reduce((a, b) => a + b, 0);
      const after = await memAvailableKiB();
      const ok = r.sandboxes.length;
      fan[n] = {
        wallMs: r1(wallMs),
        ok,
        pssMiBPerChild: r1(pss / 1024 / Math.max(1, ok)),
        memAvailMiBPerChild: r1((before - after) / 1024 / Math.max(1, ok)),
      };
      await Promise.all(r.sandboxes.map((s) => api("DELETE", `/v1/sandboxes/${s.id}`)));
    }

    const cold = median(coldMs);
    const fork = median(forkReady);
    const result = {
      date: new Date().toISOString(),
      accel: health.accel,
      memoryMiB,
      coldBootMs: { p50: r1(cold), samples: coldMs.map(r1) },
      forkToReadyMs: { p50: r1(fork), p90: r1(pct(forkReady, 90)) },
      forkToFirstExecReplyMs: { p50: r1(median(forkToExec)), p90: r1(pct(forkToExec, 90)) },
      firstExecInChildMs: { p50: r1(median(firstExec)) },
      coldOverFork: r1(cold / fork),
      coldOverForkToFirstExec: r1(cold / median(forkToExec)),
      execRttMs: { p50: r1(median(execRtt)), p90: r1(pct(execRtt, 90)) },
      evalRttMs: { p50: r1(median(evalRtt)), p90: r1(pct(evalRtt, 90)) },
      freshPythonImportNumpyMs: { p50: r1(median(freshPy)) },
      evalSpeedup: r1(median(freshPy) / median(evalRtt)),
      fanout: fan,
    };
    const rows: [string, string][] = [
      ["cold boot to first reply (p50)", `${result.coldBootMs.p50} ms`],
      ["fork to agent ready (p50 / p90)", `${result.forkToReadyMs.p50} / ${result.forkToReadyMs.p90} ms`],
      [
        "fork to first exec reply (p50 / p90)",
        `${result.forkToFirstExecReplyMs.p50} / ${result.forkToFirstExecReplyMs.p90} ms`,
      ],
      ["cold / fork-to-ready", `${result.coldOverFork}x`],
      ["cold / fork-to-first-exec", `${result.coldOverForkToFirstExec}x`],
      ["exec round trip, warm child (p50 / p90)", `${result.execRttMs.p50} / ${result.execRttMs.p90} ms`],
      ["eval round trip (p50 / p90)", `${result.evalRttMs.p50} / ${result.evalRttMs.p90} ms`],
      [
        "fresh python3 -c 'import numpy' in guest (p50)",
        `${result.freshPythonImportNumpyMs.p50} ms (${result.evalSpeedup}x eval)`,
      ],
      ...Object.entries(fan).flatMap(([n, f]): [string, string][] => [
        [`fan-out n=${n}: wall until all reply`, `${f.wallMs} ms (${f.ok}/${n} ok)`],
        [
          `fan-out n=${n}: per idle child PSS / MemAvailable delta`,
          `${f.pssMiBPerChild} / ${f.memAvailMiBPerChild} MiB`,
        ],
      ]),
    ];
    const w = Math.max(...rows.map(([k]) => k.length));
    console.log(`forkd fork benchmark (${result.accel}, ${memoryMiB} MiB guest, ${result.date})`);
    for (const [k, v] of rows) console.log(`${k.padEnd(w)}  ${v}`);
    console.log(JSON.stringify(result));
    if (args["json-out"]) await writeFile(args["json-out"], JSON.stringify(result, null, 2) + "\n");
    ok = true;
  } finally {
    // A failed run keeps the data dir for its daemon.log.
    await finishDaemon(daemon, !ok);
    if (!ok) log(`benchmark failed; daemon log kept in ${dataDir}/daemon.log`);
  }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exitCode = 1;
});
