/**
 * The audit log: every appended record becomes one parseable line (0600), rotation keeps the
 * newest files and drops the oldest without losing a line in between, and a log that cannot be
 * written counts its failures instead of throwing at the caller.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readFile, readdir, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AUDIT_FILE, AuditLog } from "../../src/audit/audit-log.js";
import type { AuditRecord } from "../../src/audit/audit-log.js";

const rec = (i: number): AuditRecord => ({
  ts: new Date(1_700_000_000_000 + i).toISOString(),
  request_id: `req-${i}`,
  caller: i % 2 ? "alice" : "local",
  token: null,
  remote: null,
  action: "DELETE /v1/sandboxes/{id}",
  target: { id: `sb-${String(i).padStart(16, "a")}` },
  status: 200,
  result: "ok",
  duration_ms: i,
});

const lines = async (path: string): Promise<AuditRecord[]> =>
  (await readFile(path, "utf8"))
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as AuditRecord);

test("one JSON line per record, in order, mode 0600", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-audit-"));
  try {
    const log = await AuditLog.open({ dir });
    for (let i = 0; i < 50; i++) log.append(rec(i));
    await log.flush();
    const got = await lines(join(dir, AUDIT_FILE));
    assert.deepEqual(
      got,
      Array.from({ length: 50 }, (_, i) => rec(i)),
    );
    assert.equal((await stat(join(dir, AUDIT_FILE))).mode & 0o777, 0o600);
    assert.deepEqual(log.stats, { written: 50, dropped: 0, failed: 0 });
    await log.close();
    log.append(rec(99)); // after close: counted, not thrown
    assert.equal(log.stats.dropped, 1);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("rotation by size keeps `keep` old files; every line of the kept files is there once", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-audit-"));
  try {
    const lineBytes = JSON.stringify(rec(100)).length + 1;
    const log = await AuditLog.open({ dir, maxBytes: lineBytes * 10, keep: 3 });
    for (let i = 100; i < 160; i++) {
      log.append(rec(i));
      await log.flush(); // one line per batch: rotation points are exact
    }
    await log.close();
    const files = (await readdir(dir)).sort();
    assert.deepEqual(files, [AUDIT_FILE, `${AUDIT_FILE}.1`, `${AUDIT_FILE}.2`, `${AUDIT_FILE}.3`]);
    const kept: AuditRecord[] = [];
    for (const f of [`${AUDIT_FILE}.3`, `${AUDIT_FILE}.2`, `${AUDIT_FILE}.1`, AUDIT_FILE]) {
      const l = await lines(join(dir, f));
      assert.ok(l.length <= 10, `${f} holds ${l.length} lines`);
      kept.push(...l);
    }
    // The newest 40 lines survive, contiguous and in order; the oldest were rotated away.
    assert.deepEqual(
      kept.map((r) => r.duration_ms),
      Array.from({ length: 40 }, (_, i) => 120 + i),
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("a log that cannot be written counts failures and never throws; the queue is bounded", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-audit-"));
  try {
    await mkdir(join(dir, AUDIT_FILE)); // a directory where the file should be: every open fails
    const errors: unknown[] = [];
    const log = await AuditLog.open({ dir, maxQueue: 5, onError: (e) => errors.push(e) });
    for (let i = 0; i < 8; i++) log.append(rec(i)); // the writer takes 1, 5 wait, 2 find the queue full
    await log.flush();
    assert.deepEqual(log.stats, { written: 0, dropped: 2, failed: 6 });
    assert.ok(errors.length >= 2, "each failed batch is reported");
    await log.close();
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
