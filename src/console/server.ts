/**
 * The loopback server of `forkd console`: the one-time login (GET /console/login?secret=S sends
 * the page to /console/#login=S, whose script posts the secret to POST /v1/console/session: the
 * reply sets the session cookie and gives the page its key), the logout (DELETE
 * /v1/console/session), tickets (POST /v1/console/ticket), the built front end under /console/
 * (no data in it: served to anyone), and /v1/* and /metrics proxied to the daemon's unix socket
 * (./proxy.ts) as the local admin. Every API call needs the cookie and the session's key
 * (X-Forkd-Console-Key; a GET or a WebSocket may bring a ticket, `?console_ticket=`, instead):
 * a cookie alone (which the browser also sends to the host's other ports) opens nothing
 * (./sessions.ts). A non-GET call also needs `X-Forkd-Console: 1` and a WebSocket upgrade an
 * Origin equal to this server's. Its connections are guarded like every listener's
 * (../util/listener-guard.ts). stopConsoleServer() ends it with its open terminals.
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import { createServer } from "node:http";
import { LOCAL } from "../access/index.js";
import { DEFAULT_LIMITS, guard, httpOptions } from "../util/index.js";
import type { ListenerLimits } from "../util/index.js";
import type { Duplex } from "node:stream";
import type { AssetReply } from "../http/index.js";
import { SECURITY_HEADERS, page, serveAsset } from "../http/index.js";
import { proxyRequest, proxyUpgrade } from "./proxy.js";
import type { ConsoleSession, ConsoleSessions } from "../access/index.js";
import { COOKIE, KEY_HEADER, TICKET_PARAM, cookieOf, setCookie } from "../access/index.js";

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
  /** Connection bounds and timeouts (default: ../util/listener-guard.ts's). */
  limits?: ListenerLimits;
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

/** The local admin, as the daemon's GET /v1/console/session names it on the unix socket. */
const LOCAL_VIEW = {
  caller: { kind: "local", name: LOCAL.name, tenant: null, admin: true, token: null },
} as const;

const header = (req: IncomingMessage, name: string): string | undefined => {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
};

/** A small JSON body (a login's secret), at most 4 KiB; null when it is not one. */
async function smallJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req as AsyncIterable<Buffer>) {
    size += c.length;
    if (size > 4096) return null;
    chunks.push(c);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8")) as unknown;
  } catch {
    return null;
  }
}

/**
 * The session a request stands for: its cookie with its key (the header), or for a GET or an
 * upgrade with a ticket (the query, used up here); null otherwise.
 */
function sessionOf(
  o: ConsoleServerOptions,
  req: IncomingMessage,
  query: URLSearchParams,
  upgrade: boolean,
): ConsoleSession | null {
  const sid = cookieOf(req.headers.cookie, cookieName(o));
  const key = header(req, KEY_HEADER);
  if (key !== undefined) return o.sessions.get(sid, key);
  const ticket = query.get(TICKET_PARAM);
  if (ticket !== null && (upgrade || req.method === "GET" || req.method === "HEAD"))
    return o.sessions.redeemTicket(sid, ticket);
  return null;
}

/** `req.url` less the ticket (it is this server's, not the daemon's). */
function withoutTicket(req: IncomingMessage): void {
  const u = new URL(req.url ?? "/", "http://localhost");
  if (!u.searchParams.has(TICKET_PARAM)) return;
  u.searchParams.delete(TICKET_PARAM);
  req.url = u.pathname + u.search;
}

async function handle(o: ConsoleServerOptions, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const { path, query } = pathOf(req);
  const name = cookieName(o);
  if (path === "/console/login") {
    // The secret goes on to the page in the fragment (never sent to a server); its script logs in.
    req.resume();
    const secret = query.get("secret") ?? "";
    // A wrong, used or expired secret is refused here already (the page would only say so later).
    if (req.method !== "GET" || !/^[A-Za-z0-9_-]{1,256}$/.test(secret) || !o.sessions.pending(secret))
      return send(res, page(401, "login refused"));
    res.writeHead(303, {
      ...SECURITY_HEADERS,
      location: `/console/#login=${secret}`,
      "cache-control": "no-store",
      "content-length": 0,
    });
    res.end();
    return;
  }
  if (path === "/v1/console/session" && req.method === "POST") {
    if (req.headers["x-forkd-console"] !== "1") {
      req.resume();
      return jsonError(res, 403, "forbidden", "a console login needs the X-Forkd-Console: 1 header");
    }
    const body = await smallJson(req);
    const secret = (body as { secret?: unknown } | null)?.secret;
    const opened = o.sessions.redeem(secret);
    if (opened === null)
      return jsonError(res, 401, "unauthenticated", "login refused: ask `forkd console` for another URL");
    return json(
      res,
      200,
      { ...LOCAL_VIEW, key: opened.key },
      { "set-cookie": setCookie(opened.id, false, name) },
    );
  }
  if (!isApi(path)) {
    req.resume();
    if (req.method !== "GET" && req.method !== "HEAD") return send(res, page(405, "method not allowed"));
    if (path === "/") {
      res.writeHead(303, { ...SECURITY_HEADERS, location: "/console/", "content-length": 0 });
      res.end();
      return;
    }
    return send(res, await serveAsset(o.dist, path));
  }
  const session = sessionOf(o, req, query, false);
  if (!session) {
    req.resume();
    return jsonError(res, 401, "unauthenticated", "log in with the URL `forkd console` printed");
  }
  if (req.method !== "GET" && req.method !== "HEAD" && req.headers["x-forkd-console"] !== "1") {
    req.resume();
    return jsonError(res, 403, "forbidden", "console requests need the X-Forkd-Console: 1 header");
  }
  const sid = cookieOf(req.headers.cookie, name);
  // The logout and the tickets are this server's: the session lives here, not in the daemon.
  if (path === "/v1/console/session" && req.method === "DELETE") {
    req.resume();
    o.sessions.close(sid);
    return json(res, 200, { ok: true }, { "set-cookie": setCookie(null, false, name) });
  }
  if (path === "/v1/console/ticket" && req.method === "POST") {
    req.resume();
    return json(res, 200, { ticket: o.sessions.ticket(sid, header(req, KEY_HEADER)) });
  }
  withoutTicket(req);
  proxyRequest(o.socket, req, res);
}

function refuseUpgrade(socket: Duplex, status: number, text: string): void {
  socket.end(
    `HTTP/1.1 ${status} ${text}\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
  );
}

export function createConsoleServer(o: ConsoleServerOptions): Server {
  const limits = o.limits ?? DEFAULT_LIMITS;
  const server = createServer(httpOptions(limits), (req, res) => {
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
      const { path, query } = pathOf(req);
      if (!sessionOf(o, req, query, true)) return refuseUpgrade(socket, 401, "Unauthorized");
      if (req.headers.origin !== o.origin()) return refuseUpgrade(socket, 403, "Forbidden");
      withoutTicket(req);
      if (!path.startsWith("/v1/")) return refuseUpgrade(socket, 404, "Not Found");
      proxyUpgrade(o.socket, req, socket, head);
    } catch {
      refuseUpgrade(socket, 400, "Bad Request");
    }
  });
  guard(server, limits);
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
