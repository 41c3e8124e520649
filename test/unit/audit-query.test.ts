/**
 * Reading the audit log back (GET /v1/audit): lines that name the sandbox, newest last; a
 * tenant's query matches the tenant the caller was scoped to, never a caller name (a tenant may
 * be called "admin"; an admin-scoped token carries a tenant label; older lines have no tenant).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AuditRecord } from "../../src/audit/audit-log.js";
import { queryAudit } from "../../src/audit/audit-query.js";
import { AuditLine, AuditLines } from "../../src/api/contract/schemas.js";

const line = (n: number, caller: string, tenant: string | null | undefined, id = "sb-1"): AuditRecord => ({
  ts: new Date(1_700_000_000_000 + n * 1000).toISOString(),
  request_id: `r${n}`,
  caller,
  token: null,
  ...(tenant === undefined ? {} : { tenant }),
  remote: null,
  action: "POST /v1/sandboxes/{id}/exec",
  target: { id },
  status: 200,
  result: "ok",
  duration_ms: 1,
});

test("a tenant sees only lines of callers scoped to it; an admin sees all; newest last, bounded", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-audit-q-"));
  try {
    const path = join(dir, "audit.jsonl");
    const lines = [
      line(1, "admin", null), // FORKD_TOKEN
      line(2, "admin", "admin"), // a tenant named "admin"
      line(3, "acme", null), // an admin-scoped token labelled acme
      line(4, "acme", "acme"),
      line(5, "local", undefined), // an older daemon's line
      line(6, "acme", "acme", "sb-2"),
      line(7, "acme", "acme"),
    ];
    await writeFile(path, lines.map((l) => JSON.stringify(l)).join("\n") + "\n{not json\n");
    const ids = (rs: AuditRecord[]) => rs.map((r) => r.request_id);
    assert.deepEqual(ids(await queryAudit(path, { names: "sb-1", tenant: "admin", limit: 10 })), ["r2"]);
    assert.deepEqual(ids(await queryAudit(path, { names: "sb-1", tenant: "acme", limit: 10 })), ["r4", "r7"]);
    assert.deepEqual(ids(await queryAudit(path, { names: "sb-1", tenant: null, limit: 10 })), [
      "r1",
      "r2",
      "r3",
      "r4",
      "r5",
      "r7",
    ]);
    assert.deepEqual(ids(await queryAudit(path, { names: "sb-1", tenant: null, limit: 2 })), ["r5", "r7"]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("every line read back is in the API's AuditLine shape: older lines get tenant null, damaged ones are skipped", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-audit-q-"));
  try {
    const path = join(dir, "audit.jsonl");
    const rows: unknown[] = [
      line(1, "local", undefined), // an older daemon's line: no tenant
      { ...line(2, "local", null), extra: "field" }, // a field the API does not state: dropped
      { ...line(3, "local", null), status: "200" }, // a wrong type: skipped
      { ...line(4, "local", null), target: { id: 7 } }, // a target that is not strings: skipped
      { ...line(5, "local", null), ts: undefined }, // a missing field: skipped
      ["sb-1"], // not an object
      line(6, "acme", "acme"),
    ];
    await writeFile(path, rows.map((l) => JSON.stringify(l)).join("\n") + "\n");
    const got = await queryAudit(path, { names: "sb-1", tenant: null, limit: 10 });
    assert.deepEqual(
      got.map((r) => r.request_id),
      ["r1", "r2", "r6"],
    );
    assert.equal(got[0]?.tenant, null);
    assert.equal("extra" in (got[1] ?? {}), false);
    // The reply is checked against docs/openapi.json, where unknown fields are refused.
    const shape = AuditLines.safeParse({ lines: got });
    assert.ok(shape.success, shape.success ? "" : shape.error.message);
    const fields = Object.keys(AuditLine.shape).sort();
    for (const r of got) assert.deepEqual(Object.keys(r).sort(), fields);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("a log of several read chunks: every match found across chunk edges, in order, the newest at the limit", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-audit-q-"));
  try {
    const path = join(dir, "audit.jsonl");
    // ~5 MiB in lines of varying length, so lines straddle the 1 MiB chunk edges everywhere.
    const lines: string[] = [];
    for (let i = 0; i < 30_000; i++) {
      const l = line(i, "local", null, i % 7 === 0 ? "sb-1" : `sb-${i}`);
      lines.push(JSON.stringify({ ...l, result: "x".repeat(i % 97) }));
    }
    // A rotated file holds the oldest.
    await writeFile(`${path}.1`, lines.slice(0, 10_000).join("\n") + "\n");
    await writeFile(path, lines.slice(10_000).join("\n") + "\n");
    const expected = lines
      .map((l) => JSON.parse(l) as AuditRecord)
      .filter((r) => r.target.id === "sb-1")
      .map((r) => r.request_id);
    const ids = async (limit: number) =>
      (await queryAudit(path, { names: "sb-1", tenant: null, limit })).map((r) => r.request_id);
    assert.deepEqual(await ids(100_000), expected);
    assert.deepEqual(await ids(1000), expected.slice(-1000));
    assert.deepEqual(await ids(1), expected.slice(-1));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
