/**
 * The loopback server of `forkd console`: the one-time login (GET /console/login?secret=S sets
 * the session cookie), the logout (DELETE /v1/console/session ends this server's session), the
 * built front end under /console/, and /v1/* and /metrics proxied to the daemon's unix socket
 * (./proxy.ts) as the local admin. Every request but the login needs the cookie; a non-GET /v1
 * call also needs `X-Forkd-Console: 1` (the CSRF guard) and a WebSocket upgrade an Origin equal
 * to this server's. stopConsoleServer() ends it with its open terminals.
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import { createServer } from "node:http";
import type { Duplex } from "node:stream";
import type { AssetReply } from "./assets.js";
import { SECURITY_HEADERS, page, serveAsset } from "./assets.js";
import { proxyRequest, proxyUpgrade } from "./proxy.js";
import type { ConsoleSessions } from "./sessions.js";
import { COOKIE, cookieOf, setCookie } from "./sessions.js";

export interface ConsoleServerOptions {
  /** The daemon's unix socket. */
  socket: string;
  /** console/dist. */
  dist: string;
  sessions: ConsoleSessions;
  /** This server's own origin (http://127.0.0.1:PORT), set once it listens. */
  origin: () => string;
  /** The session cookie's name (default forkd_console; `forkd console`: one per port). */
  cookie?: () => string;
}

/** The upgraded connections (terminals) of each server: they outlive server.close() otherwise. */
const upgraded = new WeakMap<Server, Set<Duplex>>();

function send(res: ServerResponse, r: AssetReply): void {
  res.writeHead(r.status, { ...r.headers, "content-length": r.body.length });
  res.end(r.body);
}

function jsonError(res: ServerResponse, status: number, code: string, message: string): void {
  json(res, status, { error: { code, message, details: {} } });
}

const isApi = (path: string): boolean => path === "/metrics" || path === "/v1" || path.startsWith("/v1/");

function pathOf(req: IncomingMessage): { path: string; query: URLSearchParams } {
  const u = new URL(req.url ?? "/", "http://localhost");
  return { path: u.pathname, query: u.searchParams };
}

const cookieName = (o: ConsoleServerOptions): string => o.cookie?.() ?? COOKIE;

function json(
  res: ServerResponse,
  status: number,
  value: unknown,
  headers: Record<string, string> = {},
): void {
  const body = JSON.stringify(value);
  res.writeHead(status, {
    ...SECURITY_HEADERS,
    ...headers,
    "content-type": "application/json",
    "cache-control": "no-store",
    "content-length": Buffer.byteLength(body),
  });
  res.end(body);
}

async function handle(o: ConsoleServerOptions, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const { path, query } = pathOf(req);
  const name = cookieName(o);
  if (path === "/console/login") {
    req.resume();
    const sid = req.method === "GET" ? o.sessions.redeem(query.get("secret") ?? undefined) : null;
    if (sid === null) return send(res, page(401, "login refused"));
    res.writeHead(303, {
      ...SECURITY_HEADERS,
      "set-cookie": setCookie(sid, false, name),
      location: "/console/",
      "content-length": 0,
    });
    res.end();
    return;
  }
  const sid = cookieOf(req.headers.cookie, name);
  const session = o.sessions.get(sid);
  if (isApi(path)) {
    if (!session) {
      req.resume();
      return jsonError(res, 401, "unauthenticated", "log in with the URL `forkd console` printed");
    }
    if (req.method !== "GET" && req.method !== "HEAD" && req.headers["x-forkd-console"] !== "1") {
      req.resume();
      return jsonError(res, 403, "forbidden", "console requests need the X-Forkd-Console: 1 header");
    }
    // The logout is this server's: the session lives here, not in the daemon.
    if (path === "/v1/console/session" && req.method === "DELETE") {
      req.resume();
      o.sessions.close(sid);
      return json(res, 200, { ok: true }, { "set-cookie": setCookie(null, false, name) });
    }
    proxyRequest(o.socket, req, res);
    return;
  }
  req.resume();
  if (!session) return send(res, page(401, "login refused"));
  if (req.method !== "GET" && req.method !== "HEAD") return send(res, page(405, "method not allowed"));
  if (path === "/") {
    res.writeHead(303, { ...SECURITY_HEADERS, location: "/console/", "content-length": 0 });
    res.end();
    return;
  }
  send(res, await serveAsset(o.dist, path));
}

function refuseUpgrade(socket: Duplex, status: number, text: string): void {
  socket.end(
    `HTTP/1.1 ${status} ${text}\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
  );
}

export function createConsoleServer(o: ConsoleServerOptions): Server {
  const server = createServer((req, res) => {
    handle(o, req, res).catch(() => {
      if (!res.headersSent) jsonError(res, 500, "internal", "internal error");
      else res.destroy();
    });
  });
  const open = new Set<Duplex>();
  upgraded.set(server, open);
  server.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on("error", () => socket.destroy());
    open.add(socket);
    socket.on("close", () => open.delete(socket));
    // A listener that throws would take the whole console down: every refusal is an answer.
    try {
      if (!o.sessions.get(cookieOf(req.headers.cookie, cookieName(o))))
        return refuseUpgrade(socket, 401, "Unauthorized");
      if (req.headers.origin !== o.origin()) return refuseUpgrade(socket, 403, "Forbidden");
      const { path } = pathOf(req);
      if (!path.startsWith("/v1/")) return refuseUpgrade(socket, 404, "Not Found");
      proxyUpgrade(o.socket, req, socket, head);
    } catch {
      refuseUpgrade(socket, 400, "Bad Request");
    }
  });
  server.headersTimeout = 30_000;
  server.requestTimeout = 0;
  return server;
}

/**
 * Stops `server`: no new connections, idle and active requests ended, and its upgraded
 * connections (terminals, which server.close() would wait for) destroyed; their commands end
 * with them.
 */
export function stopConsoleServer(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
    for (const s of upgraded.get(server) ?? []) s.destroy();
  });
}
