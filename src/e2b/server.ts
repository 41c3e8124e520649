/**
 * The E2B listener's request handler (FORKD_E2B_LISTEN): a request routed to a sandbox
 * (routing.ts: E2B's `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers or a `<port>-<id>.<domain>`
 * Host) is authorized (auth.ts), a paused sandbox created with auto-resume resumed, and handed to
 * the sandbox plane (sandbox-plane.ts: envd, the code interpreter, the guest's own ports); every
 * other request goes to the control plane (control/app.ts). On the sandbox plane a sandbox that
 * is not running, does not exist or is another tenant's answers 502, as E2B's proxy answers for
 * a sandbox that is gone (its SDKs read that as "not running"); every error is E2B's
 * `{code, message}`. listenE2b() bounds connections and the time to send headers.
 */
import type { IncomingMessage, RequestListener, Server, ServerResponse } from "node:http";
import { createServer as createHttpServer } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { Duplex } from "node:stream";
import { getRequestListener } from "@hono/node-server";
import type { Services } from "../api/services.js";
import type { TcpConfig } from "../daemon/config.js";
import { ForkdError, errorMessage } from "../util/errors.js";
import { authorizeSandbox } from "./auth.js";
import type { SandboxAccess } from "./auth.js";
import { createControlApp } from "./control/app.js";
import { sendE2bError, sendJson } from "./errors.js";
import { sandboxTarget } from "./routing.js";
import { createSandboxPlane } from "./sandbox-plane.js";
import type { SandboxPortHandler, SandboxTarget } from "./sandbox-plane.js";

export interface E2bHandlerOptions {
  /** Port 49999's handler (the code interpreter); absent: not served. */
  interpreter?: SandboxPortHandler;
}

const notServed: SandboxPortHandler = (req, res) => {
  req.resume();
  sendE2bError(res, new ForkdError("unavailable", "the code interpreter is not served by this daemon"));
};

export function createE2bHandler(s: Services, o: E2bHandlerOptions = {}): RequestListener {
  const control = getRequestListener(createControlApp(s).fetch);
  const plane = createSandboxPlane(s, { interpreter: o.interpreter ?? notServed });
  return (req, res) => {
    const t = sandboxTarget(req);
    if (!t) {
      void control(req, res);
      return;
    }
    sandboxRequest(s, plane, req, res, t).catch((e: unknown) => {
      s.log.warn("e2b: sandbox request failed", { id: t.sandboxId, port: t.port, error: errorMessage(e) });
      sendE2bError(res, e);
    });
  };
}

/** A sandbox-plane error as E2B's proxy would answer it. */
function planeError(
  res: ServerResponse,
  t: SandboxTarget,
  e: unknown,
  a?: SandboxAccess,
  s?: Services,
): void {
  if (e instanceof ForkdError && (e.code === "not_found" || e.code === "conflict")) {
    sendJson(res, 502, {
      code: 502,
      message: `The sandbox ${t.sandboxId} was not found (or is not running)`,
      sandboxId: t.sandboxId,
    });
    return;
  }
  sendE2bError(res, e, a?.caller, s?.info.hostDirs);
}

async function sandboxRequest(
  s: Services,
  plane: SandboxPortHandler,
  req: IncomingMessage,
  res: ServerResponse,
  t: SandboxTarget,
): Promise<void> {
  let access: SandboxAccess;
  try {
    access = authorizeSandbox(s, req, t);
    if (access.sandbox.state === "paused") {
      if (!access.sandbox.record.e2b?.autoResume)
        throw new ForkdError("conflict", `sandbox ${t.sandboxId} is paused`);
      // Auto-resume: traffic to a paused sandbox brings it back (one resume, others wait on it).
      await resumeOnce(s, t.sandboxId);
      access = { ...access, sandbox: s.sandboxes.get(t.sandboxId) };
    }
  } catch (e) {
    req.resume();
    planeError(res, t, e, undefined, s);
    return;
  }
  plane(req, res, t, access);
}

/**
 * Resumes a paused sandbox, its deadline its creation's timeout from now; a resume already in
 * progress is waited for instead.
 */
async function resumeOnce(s: Services, id: string): Promise<void> {
  const sb = s.sandboxes.get(id);
  if (sb.transition === "resume" && sb.settling) {
    await sb.settling;
    return;
  }
  if (sb.state !== "paused") return;
  const ms = sb.record.e2b?.timeoutMs;
  await s.sandboxes.resume(id, ms === undefined ? {} : { deadlineMs: ms });
}

/** The listener (HTTPS with a certificate): bounded connections, headers within 30 s. */
export async function listenE2b(t: TcpConfig, handler: RequestListener): Promise<Server> {
  const server = t.tls
    ? createHttpsServer({ cert: t.tls.cert, key: t.tls.key, minVersion: "TLSv1.2" }, handler)
    : createHttpServer(handler);
  // Long uploads and streams are bounded by the body limits and their own timeouts, not here.
  server.requestTimeout = 0;
  server.headersTimeout = 30_000;
  server.maxConnections = t.maxConnections;
  server.on("clientError", (err: NodeJS.ErrnoException, socket: Duplex) => {
    if (!socket.writable || err.code === "ECONNRESET") {
      socket.destroy();
      return;
    }
    const status =
      err.code === "HPE_HEADER_OVERFLOW" ? 431 : err.code === "ERR_HTTP_REQUEST_TIMEOUT" ? 408 : 400;
    const body = JSON.stringify({ code: status, message: "bad request" });
    socket.end(
      `HTTP/1.1 ${status} Bad Request\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`,
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(t.port, t.host, () => resolve());
  });
  return server;
}
