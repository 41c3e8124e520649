/**
 * GET /v1/audit?sandbox=ID|snapshot=TAG&limit=N: the audit lines that named a sandbox or a
 * snapshot (src/audit/audit-query.ts), newest last. An admin sees every caller's lines, a
 * tenant only its own.
 */
import { Hono } from "hono";
import { isAdmin } from "../../access/index.js";
import { queryAudit } from "../../audit/index.js";
import { ForkdError } from "../../util/index.js";
import { AUDIT_LIMIT_DEFAULT, AuditQuery } from "../contract/schemas.js";
import type { ApiEnv } from "../env.js";
import { parseQuery } from "../parse.js";
import type { Services } from "../../app/index.js";

export function auditRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();
  app.get("/", async (c) => {
    const q = parseQuery(c, AuditQuery);
    const name = q.sandbox ?? q.snapshot;
    if (name === undefined || (q.sandbox !== undefined && q.snapshot !== undefined))
      throw new ForkdError("invalid_argument", "name exactly one of sandbox= and snapshot=");
    const caller = c.get("caller");
    const path = s.audit.path;
    // A caller that is neither an admin nor a tenant's (none reaches here past the edge) sees nothing.
    const lines =
      path === undefined || (!isAdmin(caller) && caller.tenant === null)
        ? []
        : await queryAudit(path, {
            names: name,
            tenant: isAdmin(caller) ? null : caller.tenant,
            limit: q.limit === undefined ? AUDIT_LIMIT_DEFAULT : Number(q.limit),
          });
    return c.json({ lines });
  });
  return app;
}
