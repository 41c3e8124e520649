/**
 * The /metrics exposition parses with an independent Prometheus parser; gauges follow the
 * services at scrape time, histograms and counters move with what the API records; the memory
 * sharing figures come from smaps_rollup as documented.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Metrics } from "../../src/metrics/metrics.js";
import { SharingProbe, parseSmapsRollup, readSmapsRollup, sumSharing } from "../../src/metrics/memory.js";
import { count, parseMetrics, value } from "../helpers/prometheus.js";

const ROLLUP = `55e6b49b4000-7ffe2fdea000 ---p 00000000 00:00 0                          [rollup]
Rss:                1712 kB
Pss:                 405 kB
Pss_Dirty:           116 kB
Shared_Clean:       1516 kB
Shared_Dirty:          0 kB
Private_Clean:        80 kB
Private_Dirty:       116 kB
`;

test("smaps_rollup parsing and the saved-by-sharing sum (Σ Rss − Σ Pss)", async () => {
  const r = parseSmapsRollup(ROLLUP);
  assert.deepEqual(r, { rss: 1712 * 1024, pss: 405 * 1024, private: 196 * 1024 });
  const s = sumSharing([r, { rss: 1000, pss: 400, private: 100 }]);
  assert.deepEqual(s, {
    processes: 2,
    rssBytes: 1712 * 1024 + 1000,
    pssBytes: 405 * 1024 + 400,
    privateBytes: 196 * 1024 + 100,
    savedBytes: 1712 * 1024 + 1000 - (405 * 1024 + 400),
  });
  const own = await readSmapsRollup(process.pid);
  assert.ok(own && own.rss > 0 && own.pss > 0 && own.pss <= own.rss, JSON.stringify(own));
  assert.equal(await readSmapsRollup(2 ** 22 + 7), null, "a gone pid is skipped");
});

test("the exposition parses; gauges follow the sources, histograms and failures move", async () => {
  const states: Record<string, number> = { running: 0 };
  const m = new Metrics({
    version: "9.9.9",
    sandboxStates: () => states,
    snapshotStatuses: async () => ({ ready: 2, failed: 1 }),
    poolSize: () => 3,
    pool: () => ({ hot: 2, max: 8, memMiB: 1.5 }),
    sharing: new SharingProbe(() => [process.pid], 0),
    audit: () => ({ written: 7, dropped: 1, failed: 0 }),
  });
  let p = await parseMetrics((await m.render()).text);
  assert.equal(value(p, "forkd_sandboxes", { state: "running" }), 0);
  assert.equal(value(p, "forkd_sandboxes", { state: "paused" }), 0);
  assert.equal(value(p, "forkd_snapshots", { status: "ready" }), 2);
  assert.equal(value(p, "forkd_snapshots", { status: "writing" }), 0);
  assert.equal(value(p, "forkd_pool_vmms"), 3);
  assert.equal(value(p, "forkd_pool_hot_vmms"), 2);
  assert.equal(value(p, "forkd_pool_max_vmms"), 8);
  assert.equal(value(p, "forkd_pool_memory_bytes"), 1.5 * 2 ** 20);
  assert.equal(value(p, "forkd_audit_lines", { outcome: "written" }), 7);
  assert.equal(value(p, "forkd_build_info", { version: "9.9.9" }), 1);
  assert.ok(value(p, "forkd_vmm_rss_bytes") > 0);
  assert.ok(value(p, "forkd_memory_saved_bytes") >= 0);
  assert.ok(value(p, "process_resident_memory_bytes") > 0, "process basics");
  assert.equal(count(p, "forkd_fork_seconds"), 0);

  states.running = 4;
  states.exited = 1;
  m.fork(0.12);
  m.fork(0.3);
  m.branchPause(0.04);
  m.exec(1.5);
  m.failure("fork", "timeout");
  m.failure("fork", "timeout");
  m.http("/v1/sandboxes/{id}/exec", "POST", 200, 0.2);
  p = await parseMetrics((await m.render()).text);
  assert.equal(value(p, "forkd_sandboxes", { state: "running" }), 4);
  assert.equal(value(p, "forkd_sandboxes", { state: "exited" }), 1);
  assert.equal(count(p, "forkd_fork_seconds"), 2);
  assert.equal(count(p, "forkd_branch_pause_seconds"), 1);
  assert.equal(count(p, "forkd_exec_seconds"), 1);
  assert.equal(value(p, "forkd_failures_total", { op: "fork", reason: "timeout" }), 2);
  assert.equal(
    count(p, "forkd_http_request_duration_seconds", {
      route: "/v1/sandboxes/{id}/exec",
      method: "POST",
      code: "200",
    }),
    1,
  );
  assert.match((await m.render()).contentType, /^text\/plain; version=0\.0\.4/);
  await assert.rejects(parseMetrics("forkd_x{ 1\n"), /does not parse/, "the parser is strict");
});
