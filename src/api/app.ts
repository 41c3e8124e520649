/**
 * The REST API under /v1 (and Prometheus' /metrics): thin routes over the services, one error
 * envelope. Every request first passes the edge (caller, limits, audit, metrics: ./edge.ts);
 * sandbox routes are scoped to the caller's tenant (./scope.ts).
 */
import { Hono } from "hono";
import type { MiddlewareHandler } from "hono";
import { isAdmin } from "../access/index.js";
import { ForkdError } from "../util/index.js";
import { edge } from "./edge.js";
import type { ApiEnv } from "./env.js";
import { errorResponse } from "./errors.js";
import { sandboxGuard } from "./sandbox-guard.js";
import { mayHold } from "../app/index.js";
import type { ApiServices, Listener } from "./services.js";
import { accessRoutes } from "./routes/access.js";
import { snapshotRoutes } from "./routes/snapshots.js";
import { snapshotBuildRoutes } from "./routes/snapshot-build.js";
import { sandboxRoutes } from "./routes/sandboxes.js";
import { execRoutes } from "./routes/exec.js";
import { fileRoutes } from "./routes/files.js";
import { watchRoutes } from "./routes/watch.js";
import { contextRoutes } from "./routes/contexts.js";
import { terminalRoutes } from "./routes/terminal.js";
import { sandboxConsoleRoutes } from "./routes/sandbox-console.js";
import { eventRoutes } from "./routes/events.js";
import { auditRoutes } from "./routes/audit.js";
import { webhookRoutes } from "./routes/webhooks.js";
import { consoleSessionRoutes, consoleTicketRoutes } from "./routes/console-session.js";
import { FAVICON_ICO, serveAsset } from "../http/index.js";
import { buildOpenApi } from "./contract/openapi.js";
import { poolStateView } from "./views/pool.js";

/** The unix socket's listener: every caller is the local admin. */
export const LOCAL_LISTENER: Listener = { auth: null };

export function createApp(s: ApiServices, listener: Listener = LOCAL_LISTENER): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.onError((e, c) => {
    if (!(e instanceof ForkdError)) s.log.warn("unhandled error", { error: String(e), path: c.req.path });
    return errorResponse(c, e);
  });
  app.notFound((c) =>
    errorResponse(c, new ForkdError("not_found", `no route ${c.req.method} ${c.req.path}`)),
  );
  // The console's built front end (no data in it: served before the edge, without credentials).
  if (s.console) {
    const dist = s.console.dist;
    const assets: MiddlewareHandler<ApiEnv> = async (c, next) => {
      if (c.req.method !== "GET" && c.req.method !== "HEAD") return next();
      const r = await serveAsset(dist, c.req.path);
      return new Response(c.req.method === "HEAD" ? null : new Uint8Array(r.body), {
        status: r.status,
        headers: r.headers,
      });
    };
    app.use("/console", assets);
    app.use("/console/*", assets);
    app.use(FAVICON_ICO, assets);
  }
  app.use("*", edge(s, listener));

  // Public: counts only what the caller (if it sent a valid token) may see.
  app.get("/v1/health", (c) => {
    const caller = c.get("caller");
    const sandboxes = s.sandboxes.list().filter((sb) => mayHold(caller, sb.record.owner));
    return c.json({
      ok: true,
      accel: s.info.accel.accel,
      accel_reason: s.info.accel.reason,
      sandboxes: sandboxes.length,
      pool: isAdmin(caller) ? s.sandboxes.poolStatus() : {},
      pool_state: isAdmin(caller) ? poolStateView(s.sandboxes.poolState()) : undefined,
      network: isAdmin(caller) ? s.sandboxes.networkStatus() : undefined,
    });
  });

  // Generated once: the document depends only on the code.
  let openapi: Record<string, unknown> | null = null;
  app.get("/v1/openapi.json", (c) => c.json((openapi ??= buildOpenApi(s.info.version))));

  app.get("/metrics", async (c) => {
    const m = await s.metrics.render();
    return c.body(m.text, 200, { "content-type": m.contentType });
  });

  app.get("/v1/version", (c) =>
    c.json({
      version: s.info.version,
      api: "v1",
      qemu: s.info.qemu,
      accel: {
        accel: s.info.accel.accel,
        reason: s.info.accel.reason,
        forced: s.info.accel.forced,
        tsc_khz: s.info.accel.tscKhz,
      },
      started_at: s.info.startedAt,
      e2b: s.info.e2b ?? null,
    }),
  );
  // A cluster's gateway lists its nodes (src/gateway/nodes.ts). A daemon answers 404 rather than
  // list itself: alone it has no node id, no address peers reach and no record, and its
  // sandboxes name no node; a node sends its caller to a gateway.
  app.get("/v1/nodes", () => {
    const node = s.info.node ?? null;
    throw new ForkdError(
      "not_found",
      node === null
        ? "GET /v1/nodes is a cluster gateway's (forkd gateway); this is one daemon, not a cluster"
        : `GET /v1/nodes is a cluster gateway's (forkd gateway); this is node ${node} of a cluster: ask a gateway`,
    );
  });
  app.route("/v1/tokens", accessRoutes(s));
  app.route("/v1/snapshots", snapshotBuildRoutes(s));
  app.route("/v1/snapshots", snapshotRoutes(s));
  app.use("/v1/sandboxes/:id", sandboxGuard(s));
  app.use("/v1/sandboxes/:id/*", sandboxGuard(s));
  app.route("/v1/sandboxes", sandboxRoutes(s));
  app.route("/v1/sandboxes", execRoutes(s));
  app.route("/v1/sandboxes", fileRoutes(s));
  app.route("/v1/sandboxes", watchRoutes(s));
  app.route("/v1/sandboxes", contextRoutes(s));
  app.route("/v1/sandboxes", terminalRoutes(s));
  app.route("/v1/sandboxes", sandboxConsoleRoutes(s));
  app.route("/v1/events", eventRoutes(s));
  app.route("/v1/audit", auditRoutes(s));
  app.route("/v1/webhooks", webhookRoutes(s));
  app.route("/v1/console/session", consoleSessionRoutes(s, listener));
  app.route("/v1/console/ticket", consoleTicketRoutes(s));
  return app;
}
