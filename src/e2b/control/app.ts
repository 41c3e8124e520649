/**
 * E2B's control plane (its REST API, as its SDKs call it) over forkd's services: the edge (API
 * keys, limits, audit: edge.ts), the sandbox routes (sandboxes.ts), the snapshot routes
 * (snapshots.ts), and E2B's error shape `{code, message}` for every failure, unknown routes too.
 */
import { Hono } from "hono";
import type { E2bServices } from "../context.js";
import { ForkdError } from "../../util/index.js";
import { e2bError } from "../errors.js";
import { e2bEdge } from "./edge.js";
import type { E2bEnv } from "./env.js";
import { sandboxRoutes } from "./sandboxes.js";
import { snapshotRoutes } from "./snapshots.js";

export function createControlApp(s: E2bServices): Hono<E2bEnv> {
  const app = new Hono<E2bEnv>();
  app.onError((e, c) => {
    if (!(e instanceof ForkdError))
      s.log.warn("e2b: unhandled error", { error: String(e), path: c.req.path });
    const { status, body } = e2bError(e, c.get("caller"), s.info.hostDirs);
    return c.json(body, status as 400);
  });
  app.notFound((c) => c.json({ code: 404, message: `no route ${c.req.method} ${c.req.path}` }, 404));
  app.use("*", e2bEdge(s));
  app.get("/health", (c) => c.body(null, 204));
  app.route("/", sandboxRoutes(s));
  app.route("/", snapshotRoutes(s));
  return app;
}
