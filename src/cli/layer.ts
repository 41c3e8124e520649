/**
 * `forkd snapshot --from T --tag T2 --exec CMD`: a chain layer built through the API: fork one
 * child of T, run CMD in it (output streamed), branch it as T2, kill it. A failing CMD leaves
 * no snapshot behind.
 */
import type { ApiClient } from "@forkd/sdk";
import { snapshotWritten } from "./commands/branch.js";
import { execStream } from "./commands/exec.js";
import { interruptible } from "./interrupt.js";
import { ProgressView } from "./progress.js";
import type { ProgressOut } from "./progress.js";
import { CALL_MS, HEAVY_MS, execIdleMs } from "./timeouts.js";

export async function snapshotLayer(
  api: ApiClient,
  o: { from: string; tag: string; exec: string; json: boolean },
  say: (s: string) => void,
  progressOut: ProgressOut,
): Promise<number> {
  const t0 = Date.now();
  const fork = await api.fork({ snapshot_tag: o.from, n: 1 }, { timeoutMs: HEAVY_MS });
  const id = fork.sandboxes[0]?.id;
  if (!id) throw new Error(`could not fork ${o.from}: ${fork.failures[0]?.message ?? "unknown"}`);
  // Ctrl-C or a hang-up cuts the command or the wait, and still kills the child (finally).
  try {
    return await interruptible(
      `${id} is killed; no snapshot ${o.tag} unless its branch had begun`,
      (signal) => buildLayer(api, o, id, t0, say, progressOut, signal),
    );
  } finally {
    await api.kill(id, { timeoutMs: CALL_MS }).catch(() => undefined);
  }
}

async function buildLayer(
  api: ApiClient,
  o: { from: string; tag: string; exec: string; json: boolean },
  id: string,
  t0: number,
  say: (s: string) => void,
  progressOut: ProgressOut,
  signal: AbortSignal,
): Promise<number> {
  say(`forkd: building ${o.tag} on ${o.from} in ${id}: ${o.exec}`);
  // The command's output goes to stderr: stdout is for the result.
  const code = await execStream(
    api,
    id,
    { cmd: o.exec },
    { idleMs: execIdleMs(), signal, out: process.stderr, err: process.stderr },
    say,
  );
  if (code !== 0) {
    say(`forkd: the command failed (exit ${code}); no snapshot made`);
    return 1;
  }
  const view = new ProgressView(progressOut);
  let b;
  try {
    view.local({ phase: "branch", message: `pausing ${id} to copy its memory and disk` });
    b = await api.branch(id, { tag: o.tag, wait: false }, { timeoutMs: HEAVY_MS, signal });
    view.local({ phase: "write", message: `writing ${o.tag} (paused ${b.pause_ms.toFixed(1)} ms)` });
    const snapshot = b.snapshot ?? (await snapshotWritten(api, b.tag, HEAVY_MS));
    b = { ...b, status: "ready" as const, snapshot };
  } finally {
    view.end();
  }
  if (o.json) console.log(JSON.stringify(b.snapshot, null, 2));
  else console.log(`snapshot ${b.tag} ready (layer on ${o.from}): ${Date.now() - t0} ms`);
  return 0;
}
