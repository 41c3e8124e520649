/**
 * Reading the audit log back (GET /v1/audit): the lines that name a sandbox or a snapshot in
 * their target, newest last, from the tail of audit.jsonl and, when that holds too few, of the
 * newest rotated file. Each file is read at most READ_MAX from its end, so a query costs a
 * bounded read however big the log grew; a line that does not parse (cut by the bound, or
 * damaged) is skipped.
 */
import { readFileTail } from "../util/file-tail.js";
import type { AuditRecord } from "./audit-log.js";

const READ_MAX = 16 << 20;

export interface AuditQuery {
  /** The value one of the target's fields must hold (a sandbox id or a snapshot tag). */
  names: string;
  /** Only lines of callers scoped to this tenant (never an admin's); null: every caller's. */
  tenant: string | null;
  limit: number;
}

const names = (r: AuditRecord, value: string): boolean =>
  Object.values(r.target ?? {}).some((v) => (Array.isArray(v) ? v.includes(value) : v === value));

function parse(text: string, q: AuditQuery): AuditRecord[] {
  const out: AuditRecord[] = [];
  for (const line of text.split("\n")) {
    if (!line) continue;
    let r: AuditRecord;
    try {
      r = JSON.parse(line) as AuditRecord;
    } catch {
      continue;
    }
    if (typeof r !== "object" || r === null || typeof r.target !== "object") continue;
    if (q.tenant !== null && r.tenant !== q.tenant) continue;
    if (names(r, q.names)) out.push(r);
  }
  return out;
}

/** The matching lines, newest last, at most q.limit. `path`: audit.jsonl (`path`.1 is older). */
export async function queryAudit(path: string, q: AuditQuery): Promise<AuditRecord[]> {
  let found: AuditRecord[] = [];
  for (const file of [path, `${path}.1`]) {
    const tail = await readFileTail(file, READ_MAX);
    if (!tail) continue;
    found = [...parse(tail.bytes.toString("utf8"), q), ...found];
    if (found.length >= q.limit) break;
  }
  return found.slice(-q.limit);
}
