/**
 * Port 49983 of a sandbox: envd as E2B's SDKs reach it. Its Connect services (process and
 * filesystem, in the Connect protocol's JSON and binary encodings, and gRPC-web) and its HTTP
 * routes: GET /health, GET /envs, GET and POST /files. Every request is already routed to a
 * sandbox and authorized by the E2B listener (sandbox-plane.ts).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { createContextValues } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Services } from "../../api/services.js";
import { ForkdError } from "../../util/errors.js";
import type { SandboxPortHandler } from "../sandbox-plane.js";
import { CALL_ACCESS, SANDBOX_ID, envdState } from "./context.js";
import type { CallAccess } from "./context.js";
import type { EnvdState } from "./context.js";
import { download, sendError, upload } from "./files-http.js";
import { filesystemService } from "./filesystem-service.js";
import { Filesystem } from "./gen/filesystem/filesystem_pb.js";
import { Process } from "./gen/process/process_pb.js";
import { processService } from "./process-service.js";

/** A Connect message's bound (stdin, paths); files go through /files. */
const READ_MAX_BYTES = 16 << 20;

export interface EnvdHandler {
  handle: SandboxPortHandler;
  /** Stops the polling watchers (daemon shutdown). */
  close(): void;
}

export function envdHandler(s: Services, st: EnvdState = envdState(s)): EnvdHandler {
  const targets = new WeakMap<IncomingMessage, { id: string; access: CallAccess }>();
  const rpc = connectNodeAdapter({
    routes: (router) => {
      router.service(Process, processService(st));
      router.service(Filesystem, filesystemService(st));
    },
    readMaxBytes: READ_MAX_BYTES,
    contextValues: (req) => {
      const t = targets.get(req as IncomingMessage);
      const values = createContextValues().set(SANDBOX_ID, t?.id ?? "");
      return t ? values.set(CALL_ACCESS, t.access) : values;
    },
    fallback: (req, res) => {
      req.resume();
      sendError(
        res as ServerResponse,
        new ForkdError("not_found", `no route ${req.method ?? ""} ${(req.url ?? "").split("?")[0]}`),
      );
    },
  });

  const files = (req: IncomingMessage, res: ServerResponse, url: URL, id: string): void => {
    const run = async () => {
      const lease = s.sandboxes.lease(id);
      try {
        if (req.method === "GET") await download(st, req, res, url, lease, id);
        else await upload(st, req, res, url, lease, id);
      } catch (e) {
        throw await lease.explain(e);
      } finally {
        lease.release();
      }
    };
    run().catch((e: unknown) => {
      req.resume();
      sendError(res, e);
    });
  };

  const handle: SandboxPortHandler = (req, res, t, sb) => {
    const url = new URL(req.url ?? "/", "http://envd");
    const id = t.sandboxId;
    if (url.pathname === "/health") {
      req.resume();
      res.writeHead(204).end();
      return;
    }
    if (url.pathname === "/envs" && req.method === "GET") {
      req.resume();
      const env = sb.sandbox.record.env ?? {};
      const text = JSON.stringify(env);
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
      res.end(text);
      return;
    }
    if (url.pathname === "/files" && (req.method === "GET" || req.method === "POST"))
      return files(req, res, url, id);
    targets.set(req, {
      id,
      access: { owner: sb.sandbox.record.owner ?? null, credential: sb.caller.credential },
    });
    rpc(req, res);
  };

  return { handle, close: () => st.watchers.close() };
}
