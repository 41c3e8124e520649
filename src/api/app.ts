/** The REST API under /v1: thin routes over the services, one error envelope. */
import { timingSafeEqual, createHash } from "node:crypto";
import { Hono } from "hono";
import { ForkdError } from "../util/errors.js";
import { errorResponse } from "./errors.js";
import type { Services } from "./services.js";
import { snapshotRoutes } from "./routes/snapshots.js";
import { sandboxRoutes } from "./routes/sandboxes.js";
import { execRoutes } from "./routes/exec.js";
import { fileRoutes } from "./routes/files.js";
import { buildOpenApi } from "./contract/openapi.js";

const digest = (s: string) => createHash("sha256").update(s).digest();

export function createApp(s: Services): Hono {
  const app = new Hono();

  app.onError((e, c) => {
    if (!(e instanceof ForkdError)) s.log.warn("unhandled error", { error: String(e), path: c.req.path });
    return errorResponse(c, e);
  });
  app.notFound((c) =>
    errorResponse(c, new ForkdError("not_found", `no route ${c.req.method} ${c.req.path}`)),
  );

  app.get("/v1/health", (c) =>
    c.json({
      ok: true,
      accel: s.info.accel.accel,
      accel_reason: s.info.accel.reason,
      sandboxes: s.sandboxes.list().length,
      pool: s.sandboxes.poolStatus(),
      network: s.sandboxes.networkStatus(),
    }),
  );

  // Generated once: the document depends only on the code.
  let openapi: Record<string, unknown> | null = null;
  app.get("/v1/openapi.json", (c) => c.json((openapi ??= buildOpenApi(s.info.version))));

  if (s.token) {
    const want = digest(s.token);
    app.use("/v1/*", async (c, next) => {
      const h = c.req.header("authorization") ?? "";
      const got = digest(h.startsWith("Bearer ") ? h.slice(7) : "");
      if (!timingSafeEqual(want, got)) {
        return c.json(
          { error: { code: "unauthenticated", message: "missing or wrong bearer token", details: {} } },
          401,
        );
      }
      await next();
      return undefined;
    });
  }

  app.get("/v1/version", (c) =>
    c.json({
      version: s.info.version,
      api: "v1",
      qemu: s.info.qemu,
      accel: s.info.accel,
      started_at: s.info.startedAt,
    }),
  );
  app.route("/v1/snapshots", snapshotRoutes(s));
  app.route("/v1/sandboxes", sandboxRoutes(s));
  app.route("/v1/sandboxes", execRoutes(s));
  app.route("/v1/sandboxes", fileRoutes(s));
  return app;
}
