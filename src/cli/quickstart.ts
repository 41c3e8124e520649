/**
 * `forkd quickstart`: the main job in one command. Make (once) a snapshot of a warmed Python
 * parent, fork N children from it, run a shell command and a Python cell in every child, and
 * print what happened and how long it took.
 */
import { ApiError, apiRequest } from "../client/http.js";
import { CALL_MS, HEAVY_MS, SNAPSHOT_MS, evalMs as evalTimeoutMs } from "./timeouts.js";
import type { Endpoint } from "../client/http.js";
import { printTable } from "./table.js";

interface Meta {
  tag: string;
  timings: { boot_ms: number; warm_ms: number };
}
interface Child {
  id: string;
  pid: number;
  timings: { ready_ms: number; total_ms: number };
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor((s.length - 1) / 2)]! : NaN;
};

export async function quickstart(
  ep: Endpoint,
  o: { n: number; tag: string; keep: boolean },
  say: (s: string) => void,
): Promise<number> {
  let meta: Meta;
  try {
    meta = await apiRequest<Meta>(ep, "GET", `/v1/snapshots/${o.tag}`, undefined, CALL_MS);
    say(`using snapshot ${o.tag}`);
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 404) throw e;
    say(
      `creating snapshot ${o.tag}: build the guest image (first run only), boot a Python parent, import numpy, freeze it`,
    );
    const t0 = Date.now();
    const tick = setInterval(() => say(`  ... ${Math.round((Date.now() - t0) / 1000)} s`), 15_000);
    try {
      meta = await apiRequest<Meta>(
        ep,
        "POST",
        "/v1/snapshots",
        {
          tag: o.tag,
          template: "python",
          warm: "echo 'written by the parent before the snapshot' > /root/parent.txt",
          warm_eval:
            "import numpy as np\nweights = np.arange(1_000_000, dtype=np.float64)\nloaded = 'model loaded in the parent'",
        },
        SNAPSHOT_MS,
      );
    } finally {
      clearInterval(tick);
    }
    say(
      `snapshot ready in ${Math.round((Date.now() - t0) / 1000)} s (parent cold boot ${Math.round(meta.timings.boot_ms)} ms)`,
    );
  }

  say(`forking ${o.n} children from ${o.tag} ...`);
  const t0 = performance.now();
  const r = await apiRequest<{ sandboxes: Child[]; failures: { index: number; message: string }[] }>(
    ep,
    "POST",
    "/v1/sandboxes",
    {
      snapshot_tag: o.tag,
      n: o.n,
    },
    HEAVY_MS,
  );
  const forkWall = performance.now() - t0;
  for (const f of r.failures) say(`child ${f.index} failed: ${f.message}`);

  const rows = await Promise.all(
    r.sandboxes.map(async (c, i) => {
      const e0 = performance.now();
      const ex = await apiRequest<{ stdout: string; exit_code: number }>(
        ep,
        "POST",
        `/v1/sandboxes/${c.id}/exec`,
        {
          cmd: 'echo "$(hostname): $(cat /root/parent.txt | cut -c1-20)..."',
          timeout_ms: 120_000,
        },
        120_000 + CALL_MS,
      );
      const execMs = performance.now() - e0;
      const v0 = performance.now();
      const ev = await apiRequest<{ value: string | null; error: { name: string } | null }>(
        ep,
        "POST",
        `/v1/sandboxes/${c.id}/eval`,
        {
          code: `x = float(weights.sum()) + ${i}\n(loaded, x)`,
        },
        evalTimeoutMs(),
      );
      const evalMs = performance.now() - v0;
      return { c, out: ex.stdout.trim(), value: ev.value ?? ev.error?.name ?? "", execMs, evalMs };
    }),
  );
  printTable(
    ["SANDBOX", "PID", "READY_MS", "EXEC_MS", "EVAL_MS", "EXEC OUTPUT", "EVAL VALUE"],
    rows.map((x) => [
      x.c.id,
      String(x.c.pid),
      String(Math.round(x.c.timings.ready_ms)),
      x.execMs.toFixed(0),
      x.evalMs.toFixed(0),
      x.out,
      x.value.length > 52 ? x.value.slice(0, 49) + "..." : x.value,
    ]),
  );
  const ready = median(r.sandboxes.map((c) => c.timings.total_ms));
  console.log(
    [
      ``,
      `${r.sandboxes.length}/${o.n} children forked and answering in ${forkWall.toFixed(0)} ms (wall)`,
      `median fork to first agent reply: ${ready.toFixed(0)} ms; parent cold boot: ${Math.round(meta.timings.boot_ms)} ms (${(meta.timings.boot_ms / ready).toFixed(0)}x)`,
      `median first exec in a child: ${median(rows.map((x) => x.execMs)).toFixed(0)} ms; first eval: ${median(rows.map((x) => x.evalMs)).toFixed(0)} ms (all children at once; a child's first run of any code is slower under TCG, which translates it anew)`,
      `each child inherited numpy and a 1M-element array from the parent, and wrote its own state.`,
    ].join("\n"),
  );
  if (!o.keep) {
    await Promise.all(
      r.sandboxes.map((c) => apiRequest(ep, "DELETE", `/v1/sandboxes/${c.id}`, undefined, HEAVY_MS)),
    );
    say(`children killed (keep them with --keep; list with 'forkd ls')`);
  }
  return r.failures.length > 0 ? 1 : 0;
}
