/**
 * The code interpreter E2B's SDKs reach on a sandbox's port 49999 (the sandbox plane routes it
 * here), served by the daemon over forkd's warm kernels: POST /execute (execute.ts), /contexts
 * (contexts.ts), GET /health. There is no server in the guest for it.
 */
import type { E2bServices } from "../context.js";
import { ForkdError } from "../../util/index.js";
import { contextsRoute } from "./contexts.js";
import { execute } from "./execute.js";
import { NdjsonReply } from "./ndjson-reply.js";
import type { SandboxPortHandler } from "../plane-target.js";
import { sendError } from "./send-error.js";

export function interpreterHandler(s: E2bServices): SandboxPortHandler {
  return (req, res, _t, sb) => {
    const path = new URL(req.url ?? "/", "http://x").pathname;
    const method = req.method ?? "GET";
    if (path === "/health" && (method === "GET" || method === "HEAD")) {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify("OK"));
      return;
    }
    if (path === "/execute" && method === "POST") {
      execute(s, req, res, sb).catch((e: unknown) => sendError(new NdjsonReply(req, res), e));
      return;
    }
    if (contextsRoute(s, req, res, sb, path)) return;
    sendError(new NdjsonReply(req, res), new ForkdError("not_found", `no route ${method} ${path}`));
  };
}
