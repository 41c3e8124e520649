/** One audit line from what every API edge knows about a call (forkd's REST, E2B's two planes). */
import type { Caller } from "../access/index.js";
import type { AuditRecord } from "./audit-log.js";

export interface AuditedCall {
  started: Date;
  requestId: string;
  caller: Caller;
  remote: string | null | undefined;
  action: string;
  target: AuditRecord["target"];
  status: number;
  result: string;
  durationMs: number;
}

export const auditLine = (c: AuditedCall): AuditRecord => ({
  ts: c.started.toISOString(),
  request_id: c.requestId,
  caller: c.caller.name,
  token: c.caller.tokenId,
  tenant: c.caller.tenant,
  remote: c.remote ?? null,
  action: c.action,
  target: c.target,
  status: c.status,
  result: c.result,
  duration_ms: Math.round(c.durationMs),
});
