/**
 * The cluster scale benchmark (bench/cluster-scale.ts) in its smallest form, so it keeps running:
 * a real etcd, `forkd gateway` and 3 nodes over the fake VMM (no VM boots; ~15 s here), 60
 * sandboxes. Checks what it reports, not how fast: every create answered, the gateway's and the
 * node's latencies measured, etcd's counters read, the killed node's sandboxes all listed lost
 * within the bench's bound, and nothing of the run left behind (its processes, its directory).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { REPO_DIR } from "../../src/host/paths.js";

interface Out {
  results: {
    nodes: number;
    sandboxes: number;
    singles: { created: number; failed: number };
    batches: { created: number; failed: number };
    latency: { call: string; gateway: { p50: number }; direct: { p50: number } }[];
    etcd: { perCreate: { puts: number; proposals: number } };
    lost: { sandboxes: number; allLostMs: number | null };
  }[];
  mirror: { bytesPerSandbox: number } | null;
}

/** Processes whose command line names one of the bench's run directories. */
async function runProcesses(): Promise<string[]> {
  const out: string[] = [];
  for (const pid of (await readdir("/proc")).filter((n) => /^\d+$/.test(n))) {
    const cmd = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    if (cmd.includes("forkd-bench-cluster-3-")) out.push(`${pid}: ${cmd.replace(/\0/g, " ")}`);
  }
  return out;
}

const runDirs = async () =>
  (await readdir(tmpdir())).filter((n) => n.startsWith("forkd-bench-cluster-3-")).sort();

test("bench/cluster-scale.ts --nodes 3: every create answered, latencies and etcd's counters read, the killed node's sandboxes lost", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-it-bench-"));
  const before = await runDirs();
  const procsBefore = await runProcesses();
  try {
    const json = join(dir, "out.json");
    await promisify(execFile)(
      process.execPath,
      [
        join(REPO_DIR, "dist/bench/cluster-scale.js"),
        "--nodes",
        "3",
        "--per-node",
        "20",
        "--concurrency",
        "8",
        "--batch",
        "10",
        "--latency-samples",
        "20",
        "--create-samples",
        "2",
        "--nodes-per-process",
        "2",
        "--json-out",
        json,
      ],
      // ~20 s alone; generous for a loaded CI machine (the suite runs beside nothing else, but it is noisy).
      { timeout: 600_000 },
    );
    const out = JSON.parse(await readFile(json, "utf8")) as Out;
    const r = out.results[0];
    assert.ok(r);
    assert.equal(r.nodes, 3);
    assert.equal(r.singles.failed + r.batches.failed, 0);
    assert.equal(r.sandboxes, 60);
    assert.deepEqual(
      r.latency.map((l) => l.call),
      ["GET /v1/sandboxes/{id}", "POST /v1/sandboxes (one child)"],
    );
    for (const l of r.latency) assert.ok(l.gateway.p50 > 0 && l.direct.p50 > 0);
    assert.ok(r.etcd.perCreate.puts >= 3, "a sandbox's record and its two index keys");
    assert.ok(r.etcd.perCreate.proposals > 0);
    assert.ok(r.lost.sandboxes > 0, "the killed node had sandboxes");
    assert.notEqual(r.lost.allLostMs, null, "all of them listed lost");
    assert.ok((out.mirror?.bytesPerSandbox ?? 0) > 0);
    assert.deepEqual(await runDirs(), before, "its directory removed");
    assert.deepEqual(await runProcesses(), procsBefore, "none of its processes left");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
