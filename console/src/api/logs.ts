/** A sandbox's serial console tail and the audit lines that touched it or a snapshot. */
import { apiText } from "./http";

export const consoleTail = (id: string, tailBytes = 65536) =>
  apiText(`/v1/sandboxes/${encodeURIComponent(id)}/console`, { tail_bytes: tailBytes });

export const auditLines = (query: { sandbox?: string; snapshot?: string; limit?: number }) =>
  apiText("/v1/audit", query);
