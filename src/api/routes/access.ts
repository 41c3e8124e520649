/** Token management (admin callers only; the edge refuses tenants): list, create, revoke. */
import { Hono } from "hono";
import type { Services } from "../../app/index.js";
import { CreateToken, TokenId } from "../contract/schemas.js";
import { noteTarget } from "../env.js";
import type { ApiEnv } from "../env.js";
import { parseBody, parseParams } from "../parse.js";
import { z } from "zod";

export function accessRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.get("/", (c) => c.json({ tokens: s.tokens.list() }));

  app.post("/", async (c) => {
    const b = await parseBody(c, CreateToken);
    const r = await s.tokens.create({
      tenant: b.tenant,
      scope: b.scope,
      maxSandboxes: b.max_sandboxes,
      caps: {
        ...(b.max_memory_mib !== undefined ? { memoryMiB: b.max_memory_mib } : {}),
        ...(b.max_vcpus !== undefined ? { vcpus: b.max_vcpus } : {}),
        ...(b.max_build_disk_mib !== undefined ? { buildDiskMiB: b.max_build_disk_mib } : {}),
      },
      e2b: b.e2b,
    });
    noteTarget(c, "token_id", r.entry.id);
    noteTarget(c, "tenant", r.entry.tenant);
    s.log.info("token created", { id: r.entry.id, tenant: r.entry.tenant, scope: r.entry.scope });
    return c.json({ token: r.token, info: r.entry }, 201);
  });

  app.delete("/:token_id", async (c) => {
    const { token_id } = parseParams(c, z.object({ token_id: TokenId }));
    const t = await s.tokens.revoke(token_id);
    s.log.info("token revoked", { id: t.id, tenant: t.tenant });
    return c.json(t);
  });

  return app;
}
