/**
 * Reading the audit log back (GET /v1/audit): the lines that name a sandbox or a snapshot in
 * their target, newest last, from the end of audit.jsonl and, when that holds too few, of the
 * newest rotated file. Each file is read backwards a chunk at a time, stopping once enough
 * lines matched, and at most READ_MAX from its end, so a query costs a bounded read however big
 * the log grew (a query for recent lines, the console's, reads one chunk); a line that does not
 * parse (cut by the bound, or damaged) is skipped.
 */
import { open } from "node:fs/promises";
import type { AuditRecord } from "./audit-log.js";

const READ_MAX = 16 << 20;
const CHUNK = 1 << 20;
/** A "line" longer than this (a damaged file with no newlines) is skipped, not gathered. */
const LINE_MAX = 1 << 20;

export interface AuditQuery {
  /** The value one of the target's fields must hold (a sandbox id or a snapshot tag). */
  names: string;
  /** Only lines of callers scoped to this tenant (never an admin's); null: every caller's. */
  tenant: string | null;
  limit: number;
}

const names = (r: AuditRecord, value: string): boolean =>
  Object.values(r.target ?? {}).some((v) => (Array.isArray(v) ? v.includes(value) : v === value));

const str = (v: unknown): v is string => typeof v === "string";
const strOrNull = (v: unknown): v is string | null => v === null || typeof v === "string";
const isTarget = (v: unknown): v is AuditRecord["target"] =>
  typeof v === "object" &&
  v !== null &&
  !Array.isArray(v) &&
  Object.values(v).every((x) => str(x) || (Array.isArray(x) && x.every(str)));

/**
 * A line as the API states it (every field, nothing else; `tenant` null in lines of older
 * daemons), or null when a field is missing or of the wrong type (a damaged or foreign line).
 */
function record(v: unknown): AuditRecord | null {
  if (typeof v !== "object" || v === null) return null;
  const r = v as Record<string, unknown>;
  const tenant = r.tenant ?? null;
  if (!str(r.ts) || !str(r.request_id) || !str(r.caller) || !strOrNull(r.token)) return null;
  if (!strOrNull(tenant) || !strOrNull(r.remote) || !str(r.action) || !isTarget(r.target)) return null;
  if (!Number.isInteger(r.status) || !str(r.result) || typeof r.duration_ms !== "number") return null;
  return {
    ts: r.ts,
    request_id: r.request_id,
    caller: r.caller,
    token: r.token,
    tenant,
    remote: r.remote,
    action: r.action,
    target: r.target,
    status: r.status as number,
    result: r.result,
    duration_ms: r.duration_ms,
  };
}

function parse(text: string, q: AuditQuery): AuditRecord[] {
  const out: AuditRecord[] = [];
  for (const line of text.split("\n")) {
    if (!line) continue;
    let r: AuditRecord | null;
    try {
      r = record(JSON.parse(line));
    } catch {
      continue;
    }
    if (r === null) continue;
    if (q.tenant !== null && r.tenant !== q.tenant) continue;
    if (names(r, q.names)) out.push(r);
  }
  return out;
}

/** The matching lines of `file`, newest last, read backwards until `want` matched (or READ_MAX). */
async function fromEnd(file: string, q: AuditQuery, want: number): Promise<AuditRecord[]> {
  let fh;
  try {
    fh = await open(file, "r");
  } catch {
    return [];
  }
  try {
    const { size } = await fh.stat();
    const stop = Math.max(0, size - READ_MAX);
    let pos = size;
    /** The start of the oldest line read so far, whose beginning lies in the next chunk back. */
    let carry = Buffer.alloc(0);
    let found: AuditRecord[] = [];
    while (pos > stop && found.length < want) {
      const n = Math.min(CHUNK, pos - stop);
      const buf = Buffer.alloc(n);
      const { bytesRead } = await fh.read(buf, 0, n, pos - n);
      pos -= n;
      let text = Buffer.concat([buf.subarray(0, bytesRead), carry]);
      carry = Buffer.alloc(0);
      if (pos > stop) {
        // The part before the first newline may be the end of a line that began further back.
        const nl = text.indexOf(0x0a);
        if (nl < 0) {
          if (text.length <= LINE_MAX) carry = text;
          continue;
        }
        carry = text.subarray(0, nl);
        if (carry.length > LINE_MAX) carry = Buffer.alloc(0);
        text = text.subarray(nl + 1);
      }
      found = [...parse(text.toString("utf8"), q), ...found];
    }
    return found;
  } finally {
    await fh.close();
  }
}

/** The matching lines, newest last, at most q.limit. `path`: audit.jsonl (`path`.1 is older). */
export async function queryAudit(path: string, q: AuditQuery): Promise<AuditRecord[]> {
  let found: AuditRecord[] = [];
  for (const file of [path, `${path}.1`]) {
    found = [...(await fromEnd(file, q, q.limit - found.length)), ...found];
    if (found.length >= q.limit) break;
  }
  return found.slice(-q.limit);
}
