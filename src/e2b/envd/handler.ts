/**
 * Port 49983 of a sandbox: envd as E2B's SDKs reach it. Its Connect services (process and
 * filesystem, in the Connect protocol's JSON and binary encodings, and gRPC-web) and its HTTP
 * routes: GET /health, GET /envs, GET and POST /files. Every request is already routed to a
 * sandbox and authorized by the E2B listener (sandbox-plane.ts).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { Code, ConnectError, createConnectRouter, createContextValues } from "@connectrpc/connect";
import {
  compressionBrotli,
  compressionGzip,
  universalRequestFromNodeRequest,
  universalResponseToNodeResponse,
} from "@connectrpc/connect-node";
import type { E2bServices } from "../context.js";
import { ForkdError } from "../../util/index.js";
import type { SandboxPortHandler } from "../plane-target.js";
import { checkedBinaryBody } from "./binary-input.js";
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

export function envdHandler(s: E2bServices, st: EnvdState = envdState(s)): EnvdHandler {
  // connect-node's adapter, with each binary message decoded first (./binary-input.ts: one that
  // does not decode is invalid_argument, not the library's internal).
  const router = createConnectRouter({
    readMaxBytes: READ_MAX_BYTES,
    acceptCompression: [compressionGzip, compressionBrotli],
  });
  router.service(Process, processService(st));
  router.service(Filesystem, filesystemService(st));
  const procedures = new Map(router.handlers.map((h) => [h.requestPath, h]));
  const rpc = (req: IncomingMessage, res: ServerResponse, id: string, access: CallAccess): void => {
    const procedure = procedures.get((req.url ?? "").split("?")[0] ?? "");
    if (!procedure) {
      req.resume();
      sendError(
        res,
        new ForkdError("not_found", `no route ${req.method ?? ""} ${(req.url ?? "").split("?")[0]}`),
      );
      return;
    }
    const u = universalRequestFromNodeRequest(
      req,
      res,
      undefined,
      createContextValues().set(SANDBOX_ID, id).set(CALL_ACCESS, access),
    );
    const body =
      typeof u.body === "object" && u.body !== null && Symbol.asyncIterator in u.body
        ? checkedBinaryBody(u.body, {
            schema: procedure.method.input,
            contentType: u.header.get("content-type"),
            contentEncoding: u.header.get("content-encoding"),
            maxBytes: READ_MAX_BYTES,
          })
        : u.body;
    procedure({ ...u, body })
      .then((r) => universalResponseToNodeResponse(r, res))
      .catch((e: unknown) => {
        // A reply that broke off (the client went, or the stream failed midway): cut here too.
        if (ConnectError.from(e).code !== Code.Aborted) res.destroy();
      });
  };

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
    rpc(req, res, id, { owner: sb.sandbox.record.owner ?? null, credential: sb.caller.credential });
  };

  return { handle, close: () => st.watchers.close() };
}
