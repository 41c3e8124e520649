/**
 * Code contexts of a sandbox's warm kernels (src/agent/eval-contexts.ts): create, list, delete,
 * restart. A context belongs to one kernel: `language` names it (default python).
 */
import { Hono } from "hono";
import type { Services } from "../../app/index.js";
import type { ApiEnv } from "../env.js";
import { ContextParam, ContextQuery, CreateContext } from "../contract/schemas.js";
import { parseBody, parseParams, parseQuery } from "../parse.js";

export function contextRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.post("/:id/contexts", async (c) => {
    const body = await parseBody(c, CreateContext);
    const [ctx] = await s.sandboxes.use(c.req.param("id"), (agent) =>
      agent.contexts(body.language, { op: "create", ...(body.cwd ? { cwd: body.cwd } : {}) }),
    );
    return c.json(ctx);
  });

  app.get("/:id/contexts", async (c) => {
    const q = parseQuery(c, ContextQuery);
    const contexts = await s.sandboxes.use(c.req.param("id"), (agent) =>
      agent.contexts(q.language, { op: "list" }),
    );
    return c.json({ contexts });
  });

  app.delete("/:id/contexts/:context", async (c) => {
    const { id, context } = parseParams(c, ContextParam);
    const q = parseQuery(c, ContextQuery);
    const [ctx] = await s.sandboxes.use(id, (agent) => agent.contexts(q.language, { op: "delete", context }));
    return c.json(ctx);
  });

  app.post("/:id/contexts/:context/restart", async (c) => {
    const { id, context } = parseParams(c, ContextParam);
    const q = parseQuery(c, ContextQuery);
    const [ctx] = await s.sandboxes.use(id, (agent) =>
      agent.contexts(q.language, { op: "restart", context }),
    );
    return c.json(ctx);
  });

  return app;
}
