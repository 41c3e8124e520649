/**
 * The E2B listener's request handler (FORKD_E2B_LISTEN): a request routed to a sandbox
 * (src/http/sandbox-route.ts: E2B's `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers or a `<port>-<id>.<domain>`
 * Host) is authorized (auth.ts), takes its caller's slots and is audited (plane-edge.ts), a paused
 * sandbox created with auto-resume is resumed, and it is handed to the sandbox plane
 * (sandbox-plane.ts: envd, the code interpreter, the guest's own ports); every other request goes
 * to the control plane (control/app.ts). An upgrade (a WebSocket, the listener's `upgrade` event:
 * createE2bUpgradeHandler) goes the same way to a guest's own port (guest-port.ts). On the sandbox
 * plane a sandbox that is not running, does not exist, is another tenant's or is asked with a
 * credential that does not open it answers 502, as E2B's proxy answers for a sandbox that is gone
 * (its SDKs read that as "not running"); every error is E2B's `{code, message}`. listenE2b()
 * guards the listener (connections per address and overall, header and idle timeouts).
 */
import type { IncomingMessage, RequestListener, Server, ServerResponse } from "node:http";
import { STATUS_CODES, createServer as createHttpServer } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { Duplex } from "node:stream";
import { getRequestListener } from "@hono/node-server";
import type { E2bServices } from "./context.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { DEFAULT_LIMITS, guard, httpOptions } from "../util/index.js";
import type { ListenerLimits } from "../util/index.js";
import { authorizeSandbox } from "./auth.js";
import type { SandboxAccess } from "./plane-target.js";
import { createControlApp } from "./control/app.js";
import { e2bError, sendE2bError } from "./errors.js";
import { guestPortUpgrade } from "./guest-port.js";
import { PlaneCall } from "./plane-edge.js";
import { sandboxTarget, sendJson } from "../http/index.js";
import { ENVD_PORT, INTERPRETER_PORT, createSandboxPlane } from "./sandbox-plane.js";
import type { SandboxPortHandler } from "./plane-target.js";
import type { SandboxTarget } from "../http/index.js";

export interface E2bHandlerOptions {
  /** Port 49999's handler (the code interpreter); absent: not served. */
  interpreter?: SandboxPortHandler;
}

const notServed: SandboxPortHandler = (req, res) => {
  req.resume();
  sendE2bError(res, new ForkdError("unavailable", "the code interpreter is not served by this daemon"));
};

export function createE2bHandler(s: E2bServices, o: E2bHandlerOptions = {}): RequestListener {
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

/** A sandbox-plane error as E2B's proxy would answer it: its status and body, and headers. */
function planeErrorReply(
  t: SandboxTarget,
  e: unknown,
  s?: E2bServices,
): { status: number; body: unknown; headers: Record<string, string> } {
  if (e instanceof ForkdError && (e.code === "not_found" || e.code === "conflict"))
    return {
      status: 502,
      body: {
        code: 502,
        message: `The sandbox ${t.sandboxId} was not found (or is not running)`,
        sandboxId: t.sandboxId,
      },
      headers: {},
    };
  return e2bError(e, undefined, s?.info.hostDirs);
}

/**
 * Authorizes `req` (auth.ts), takes its caller's slots (plane-edge.ts; a resume is heavy) and
 * resumes a paused sandbox created with auto-resume: the access to hand to the plane.
 */
async function admitted(
  s: E2bServices,
  req: IncomingMessage,
  t: SandboxTarget,
  call: PlaneCall,
): Promise<SandboxAccess> {
  let access = authorizeSandbox(s, req, t);
  const paused = access.sandbox.state === "paused";
  if (paused && !access.sandbox.record.e2b?.autoResume)
    throw new ForkdError("conflict", `sandbox ${t.sandboxId} is paused`);
  call.admit(access, paused);
  if (paused) {
    // Auto-resume: traffic to a paused sandbox brings it back (one resume, others wait on it).
    await resumeOnce(s, t.sandboxId);
    access = { ...access, sandbox: s.sandboxes.get(t.sandboxId) };
  }
  return access;
}

async function sandboxRequest(
  s: E2bServices,
  plane: SandboxPortHandler,
  req: IncomingMessage,
  res: ServerResponse,
  t: SandboxTarget,
): Promise<void> {
  const call = new PlaneCall(s, req, t);
  // The slots are held, and the audit line written, until the reply ends or the client goes.
  res.on("close", () =>
    call.end(
      res.statusCode,
      !res.writableFinished ? "client_closed" : res.statusCode >= 400 ? String(res.statusCode) : "ok",
    ),
  );
  let access: SandboxAccess;
  try {
    access = await admitted(s, req, t, call);
  } catch (e) {
    req.resume();
    const r = planeErrorReply(t, e, s);
    sendJson(res, r.status, r.body, r.headers);
    return;
  }
  plane(req, res, t, access);
}

/**
 * The E2B listener's `upgrade` handler (a WebSocket): to a guest's own port, routed, authorized
 * and limited as any sandbox-plane request and relayed by guestPortUpgrade(); anything else is
 * refused on the raw socket. Never throws: every error closes the socket.
 */
export function createE2bUpgradeHandler(
  s: E2bServices,
  o: { handshakeTimeoutMs?: number } = {},
): (req: IncomingMessage, socket: Duplex, head: Buffer) => void {
  return (req, socket, head) => {
    socket.on("error", () => socket.destroy());
    try {
      const t = sandboxTarget(req);
      if (!t || t.port === ENVD_PORT || t.port === INTERPRETER_PORT) {
        const what = t ? `port ${t.port} takes no upgrade` : "only a sandbox's own ports take an upgrade";
        return rawReply(socket, 404, { code: 404, message: what }, {});
      }
      const call = new PlaneCall(s, req, t, true);
      let relayed = false;
      socket.on("close", () => {
        if (!relayed) call.end(0, "client_closed");
      });
      // A half-open socket (the client gone while it waits) is closed.
      socket.once("end", () => {
        if (!relayed) socket.destroy();
      });
      admitted(s, req, t, call).then(
        () => {
          if (socket.destroyed) return;
          relayed = true;
          guestPortUpgrade(s, req, socket, head, t, {
            ...o,
            done: (status) =>
              call.end(status, status === 101 ? "ok" : status === 0 ? "client_closed" : String(status)),
          });
        },
        (e: unknown) => {
          const r = planeErrorReply(t, e, s);
          call.end(r.status, String(r.status));
          rawReply(socket, r.status, r.body, r.headers);
        },
      );
    } catch (e) {
      s.log.warn("e2b: upgrade failed", { error: errorMessage(e) });
      socket.destroy();
    }
  };
}

/** A whole JSON reply on a raw socket, then its end. */
function rawReply(socket: Duplex, status: number, body: unknown, headers: Record<string, string>): void {
  if (!socket.writable) return void socket.destroy();
  const text = JSON.stringify(body);
  const extra = Object.entries(headers)
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join("");
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? "Error"}\r\ncontent-type: application/json\r\n` +
      `content-length: ${Buffer.byteLength(text)}\r\n${extra}connection: close\r\n\r\n${text}`,
  );
}

/**
 * Resumes a paused sandbox, its deadline its creation's timeout from now; a resume already in
 * progress is waited for instead.
 */
async function resumeOnce(s: E2bServices, id: string): Promise<void> {
  const sb = s.sandboxes.get(id);
  if (sb.transition === "resume" && sb.settling) {
    await sb.settling;
    return;
  }
  if (sb.state !== "paused") return;
  const ms = sb.record.e2b?.timeoutMs;
  await s.sandboxes.resume(id, ms === undefined ? {} : { deadlineMs: ms });
}

/** Where and how E2B's listener listens (the daemon's FORKD_E2B_LISTEN and TLS settings). */
export interface E2bListen {
  host: string;
  port: number;
  tls: { cert: Buffer; key: Buffer } | null;
  maxConnections: number;
}

/** The listener (HTTPS with a certificate), guarded (../util/listener-guard.ts). */
export async function listenE2b(
  t: E2bListen,
  handler: RequestListener,
  upgrade?: (req: IncomingMessage, socket: Duplex, head: Buffer) => void,
  limits: ListenerLimits = DEFAULT_LIMITS,
): Promise<Server> {
  const l = { ...limits, maxConnections: t.maxConnections };
  const server = t.tls
    ? createHttpsServer(
        { ...httpOptions(l), cert: t.tls.cert, key: t.tls.key, minVersion: "TLSv1.2" },
        handler,
      )
    : createHttpServer(httpOptions(l), handler);
  if (upgrade) server.on("upgrade", upgrade);
  // A malformed or timed-out request: E2B's error body, then the connection is destroyed.
  guard(server, l, (status) => {
    const body = JSON.stringify({ code: status, message: "bad request" });
    return `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? "Bad Request"}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`;
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(t.port, t.host, () => resolve());
  });
  return server;
}
