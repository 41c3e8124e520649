import { Hono } from "hono";
import { ForkdError } from "../../util/errors.js";
import type { Services } from "../services.js";
import { Branch, CreateSandboxes, SetTimeout } from "../contract/schemas.js";
import { parseBody } from "../parse.js";
import { viewOf } from "../../sandbox/sandbox.js";
import { parseNetwork } from "../../net/policy.js";

export function sandboxRoutes(s: Services): Hono {
  const app = new Hono();

  app.get("/", (c) => c.json({ sandboxes: s.sandboxes.list() }));

  app.post("/", async (c) => {
    const body = await parseBody(c, CreateSandboxes);
    const r = await s.sandboxes.fork(body.snapshot_tag, body.n, {
      timeoutMs: body.timeout_ms ?? null,
      metadata: body.metadata,
      onIdle: body.on_idle,
      network: parseNetwork(body.network),
    });
    if (r.sandboxes.length === 0) {
      const first = r.failures[0];
      throw new ForkdError(
        first?.code === "timeout" ? "timeout" : "vmm_error",
        `every child failed: ${first?.message ?? "unknown"}`,
        { failures: r.failures },
      );
    }
    return c.json(r, 201);
  });

  app.get("/:id", (c) => c.json(viewOf(s.sandboxes.get(c.req.param("id")))));

  app.post("/:id/branch", async (c) => {
    const body = await parseBody(c, Branch);
    const r = await s.sandboxes.branch(c.req.param("id"), body.tag, body.wait);
    return c.json(
      {
        tag: r.tag,
        status: r.status,
        pause_ms: r.pauseMs,
        private_bytes: r.privateBytes,
        snapshot: r.snapshot?.meta ?? null,
      },
      r.status === "ready" ? 201 : 202,
    );
  });

  app.post("/:id/pause", async (c) => c.json(await s.sandboxes.pause(c.req.param("id"))));
  app.post("/:id/resume", async (c) => c.json(await s.sandboxes.resume(c.req.param("id"))));

  app.post("/:id/timeout", async (c) => {
    const body = await parseBody(c, SetTimeout);
    return c.json(await s.sandboxes.setIdleTimeout(c.req.param("id"), body.timeout_ms));
  });

  app.delete("/:id", async (c) => {
    const id = c.req.param("id");
    await s.sandboxes.kill(id);
    return c.json({ deleted: id });
  });

  return app;
}
