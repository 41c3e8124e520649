/** A sandbox's serial console tail and the audit lines that touched it or a snapshot. */
import { api, apiText } from "./http";
import type { AuditLines } from "./types";

export const consoleTail = (id: string, tailBytes = 65536) =>
  apiText(`/v1/sandboxes/${encodeURIComponent(id)}/console`, { tail_bytes: tailBytes });

export const auditLines = (query: { sandbox?: string; snapshot?: string; limit?: number }) =>
  api<AuditLines>("GET", "/v1/audit", undefined, query);
