/**
 * What is recorded of every call at every front door's edge, once it is over: its latency and
 * failure in the metrics (for a door that keeps series of its routes), and for what changes
 * something one audit line (src/audit/audit-line.ts), refused calls included.
 */
import { randomUUID } from "node:crypto";
import type { Caller } from "../access/index.js";
import type { AuditRecord } from "../audit/index.js";
import { auditLine } from "../audit/index.js";
import type { Services } from "./services.js";

/** A call as its edge received it. */
export interface CallStart {
  started: Date;
  /** performance.now() at its start. */
  t0: number;
  requestId: string;
}

export const startCall = (): CallStart => ({
  started: new Date(),
  t0: performance.now(),
  requestId: randomUUID(),
});

/** A call as its edge saw it end. */
export interface CallEnd {
  caller: Caller;
  remote: string | null | undefined;
  method: string;
  status: number;
  /** "ok", or why it failed (an error code, a status, `token_revoked`). */
  result: string;
  target: AuditRecord["target"];
  /** The audit line's action; null: the call is not audited. */
  action: string | null;
  /** The metrics series of its route, and its failure's operation and reason (absent: none recorded). */
  series?: { route: string; failure?: { op: string; reason: string } };
}

export function recordCall(s: Services, start: CallStart, end: CallEnd): void {
  const ms = performance.now() - start.t0;
  if (end.series) {
    s.metrics.http(end.series.route, end.method, end.status, ms / 1000);
    const f = end.series.failure;
    if (f) s.metrics.failure(f.op, f.reason);
  }
  if (end.action === null) return;
  s.audit.append(
    auditLine({
      started: start.started,
      requestId: start.requestId,
      caller: end.caller,
      remote: end.remote,
      action: end.action,
      target: end.target,
      status: end.status,
      result: end.result,
      durationMs: ms,
    }),
  );
}
