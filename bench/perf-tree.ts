/**
 * Row 8 of issue 15: the pre-started VMMs a daemon holds after a tree search (every node a
 * branch of a child of its parent, two branches per child, each branch forked once), counted
 * as QEMU processes on the daemon's data dir that serve no sandbox, cross-checked with the
 * pool status the API reports; against the same count before the search (after one fork of
 * the tree's root snapshot).
 */
import type { PartResult, PerfCtx } from "./perf-context.js";
import {
  branch,
  createSnapshot,
  evalCell,
  execTrue,
  forkOne,
  kill,
  poolStatus,
  settlePool,
  writeCell,
} from "./ops.js";
import type { Api } from "./ops.js";
import { vmmPids } from "./host-measures.js";

const ROOT = "perf-tree";

interface Held {
  processes: number;
  api: number;
  byTag: Record<string, number>;
}

async function idleVmms(api: Api, dataDir: string, settleMaxMs: number): Promise<Held> {
  await settlePool(api, null, { stableMs: 3000, maxMs: settleMaxMs });
  const { sandboxes } = await api<{ sandboxes: { pid: number; state: string }[] }>("GET", "/v1/sandboxes");
  const serving = new Set(sandboxes.filter((s) => s.state !== "exited").map((s) => s.pid));
  const pids = (await vmmPids(dataDir)).filter((p) => !serving.has(p));
  const byTag = await poolStatus(api);
  return { processes: pids.length, api: Object.values(byTag).reduce((a, b) => a + b, 0), byTag };
}

export async function measureTree(ctx: PerfCtx): Promise<PartResult> {
  const { api, dataDir } = ctx.d;
  const { treeBranches, treeMemoryMiB, settleMs } = ctx.opts;
  const settleMax = Math.max(15_000, settleMs * 5);
  ctx.log(`row 8: snapshot ${ROOT} (${treeMemoryMiB} MiB), a tree search of ${treeBranches} branches`);
  await createSnapshot(api, { tag: ROOT, memory_mib: treeMemoryMiB, warm_eval: "import os" });
  await kill(api, (await forkOne(api, ROOT)).id);
  const before = await idleVmms(api, dataDir, settleMax);
  ctx.log(`  before: ${before.processes} idle VMM processes (API: ${before.api})`);

  const frontier = [ROOT];
  const branches: string[] = [];
  const forked = new Set<string>([ROOT]);
  while (branches.length < treeBranches) {
    const from = frontier.shift();
    if (!from) break;
    const child = await forkOne(api, from);
    forked.add(from);
    await evalCell(api, child.id, writeCell(`_n${branches.length}`, 1));
    for (let k = 0; k < 2 && branches.length < treeBranches; k++) {
      const b = await branch(api, child.id, `perf-tree-${branches.length + 1}`);
      branches.push(b.tag);
      frontier.push(b.tag);
    }
    await kill(api, child.id);
  }
  for (const tag of branches) {
    if (forked.has(tag)) continue;
    const c = await forkOne(api, tag);
    await execTrue(api, c.id);
    await kill(api, c.id);
    forked.add(tag);
  }
  const after = await idleVmms(api, dataDir, settleMax);
  ctx.log(`  after: ${after.processes} idle VMM processes (API: ${after.api})`);
  await api("DELETE", `/v1/snapshots/${ROOT}?cascade=1`);
  return {
    rows: [
      {
        id: "8",
        figure: `pre-started VMMs after a tree search of ${branches.length} branches, each forked once`,
        unit: "count",
        value: after.processes,
        baseline: before.processes,
        baselineWhat: "before the search (its root forked once)",
        goal: { kind: "max", value: 8 },
        today: "28 (2 per snapshot)",
        note:
          after.api === after.processes
            ? `the API's pool status agrees (${after.api})`
            : `the API's pool status says ${after.api}, the processes ${after.processes}`,
      },
    ],
    details: { branches, before, after },
  };
}
