/**
 * `forkd quickstart`: the main job in one command. Make (once) a snapshot of a warmed Python
 * parent, fork N children from it, run a shell command and a Python cell in every child, and
 * print what happened and how long it took.
 */
import { NotFoundError } from "@forkd/sdk";
import type { ApiClient, Wire } from "@forkd/sdk";
import { CALL_MS, HEAVY_MS, PROGRESS_IDLE_MS, evalMs as evalTimeoutMs } from "./timeouts.js";
import { fanOut, interruptible } from "./interrupt.js";
import { ProgressView } from "./progress.js";
import type { ProgressOut } from "./progress.js";
import { printTable } from "./table.js";

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor((s.length - 1) / 2)]! : NaN;
};

interface Row {
  c: Wire["Sandbox"];
  out: string;
  value: string;
  execMs: number;
  evalMs: number;
}

/** A shell command and a Python cell in child `i`, timed. */
async function useChild(api: ApiClient, c: Wire["Sandbox"], i: number, signal: AbortSignal): Promise<Row> {
  const e0 = performance.now();
  const ex = await api.exec(
    c.id,
    { cmd: 'echo "$(hostname): $(cat /root/parent.txt | cut -c1-20)..."', timeout_ms: 120_000 },
    { timeoutMs: 120_000 + CALL_MS, signal },
  );
  const execMs = performance.now() - e0;
  const v0 = performance.now();
  const ev = await api.eval(
    c.id,
    { code: `x = float(weights.sum()) + ${i}\n(loaded, x)` },
    { timeoutMs: evalTimeoutMs(), signal },
  );
  const evalMs = performance.now() - v0;
  return { c, out: ex.stdout.trim(), value: ev.value ?? ev.error?.name ?? "", execMs, evalMs };
}

export async function quickstart(
  api: ApiClient,
  o: { n: number; tag: string; keep: boolean },
  say: (s: string) => void,
  progressOut: ProgressOut,
): Promise<number> {
  let meta: Wire["Snapshot"];
  try {
    const got = await api.getSnapshot(o.tag, { timeoutMs: CALL_MS });
    if ("status" in got && (got.status === "writing" || got.status === "failed"))
      throw new Error(`snapshot ${o.tag} is ${got.status}; use another --tag, or delete it (forkd rmi)`);
    meta = got as Wire["Snapshot"];
    say(`using snapshot ${o.tag}`);
  } catch (e) {
    if (!(e instanceof NotFoundError)) throw e;
    say(
      `creating snapshot ${o.tag}: build the guest image (first run only), boot a Python parent, import numpy, freeze it`,
    );
    const t0 = Date.now();
    const view = new ProgressView(progressOut);
    try {
      meta = await api.createSnapshot(
        {
          tag: o.tag,
          template: "python",
          warm: "echo 'written by the parent before the snapshot' > /root/parent.txt",
          warm_eval:
            "import numpy as np\nweights = np.arange(1_000_000, dtype=np.float64)\nloaded = 'model loaded in the parent'",
        },
        { timeoutMs: PROGRESS_IDLE_MS, onProgress: (ev) => view.event(ev) },
      );
    } finally {
      view.end();
    }
    say(
      `snapshot ready in ${Math.round((Date.now() - t0) / 1000)} s (parent cold boot ${Math.round(meta.timings.boot_ms)} ms)`,
    );
  }

  say(`forking ${o.n} children from ${o.tag} ...`);
  const t0 = performance.now();
  const r = await api.fork({ snapshot_tag: o.tag, n: o.n }, { timeoutMs: HEAVY_MS });
  const forkWall = performance.now() - t0;
  for (const f of r.failures) say(`child ${f.index} failed: ${f.message}`);

  // Ctrl-C or a failing child still ends with every child killed (unless --keep).
  try {
    const rows = await interruptible(
      o.keep ? "the children keep running" : "the children are killed",
      // A signal of its own for each child (not N children's listeners on one).
      (signal) => {
        const each = fanOut(signal, r.sandboxes.length);
        return Promise.all(r.sandboxes.map((c, i) => useChild(api, c, i, each[i]!)));
      },
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
    const lines = [
      ``,
      `${r.sandboxes.length}/${o.n} children forked and answering in ${forkWall.toFixed(0)} ms (wall)`,
    ];
    if (rows.length > 0) {
      const ready = median(r.sandboxes.map((c) => c.timings.total_ms));
      lines.push(
        `median fork to first agent reply: ${ready.toFixed(0)} ms; parent cold boot: ${Math.round(meta.timings.boot_ms)} ms (${(meta.timings.boot_ms / ready).toFixed(0)}x)`,
        `median first exec in a child: ${median(rows.map((x) => x.execMs)).toFixed(0)} ms; first eval: ${median(rows.map((x) => x.evalMs)).toFixed(0)} ms (all children at once; a child's first run of any code is slower under TCG, which translates it anew)`,
        `each child inherited numpy and a 1M-element array from the parent, and wrote its own state.`,
      );
    }
    console.log(lines.join("\n"));
  } finally {
    if (!o.keep) {
      const killed = await Promise.allSettled(
        r.sandboxes.map((c) => api.kill(c.id, { timeoutMs: HEAVY_MS })),
      );
      const left = killed.filter((k) => k.status === "rejected").length;
      say(
        left === 0
          ? `children killed (keep them with --keep; list with 'forkd ls')`
          : `${left} children could not be killed: see 'forkd ls'`,
      );
    }
  }
  return r.failures.length > 0 ? 1 : 0;
}
