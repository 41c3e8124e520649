/**
 * The web console through the gateway: its built front end (src/http/console-assets.ts, as a
 * daemon serves it) and its session exchange (the routes of src/api/routes/console-session.ts,
 * over sealed sessions: src/access/sealed-sessions.ts): POST /v1/console/session exchanges a
 * token for the session cookie and the page's key, GET says who is logged in, DELETE logs out,
 * POST /v1/console/ticket gives a single-use ticket for a URL. Any gateway replica opens a
 * session another made; nothing is stored but a used ticket's mark in etcd.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { ANONYMOUS, KEY_HEADER, cookieOf, isAdmin, setCookie } from "../access/index.js";
import type { Caller } from "../access/index.js";
import { sendJson, serveAsset } from "../http/index.js";
import { ForkdError } from "../util/index.js";
import type { Authenticated } from "./auth.js";
import type { Gateway } from "./context.js";
import { jsonObject, readBody } from "./reply.js";

function callerView(c: Caller): { caller: Record<string, unknown> } {
  return {
    caller: {
      kind: c.tokenId === null ? "admin" : "token",
      name: c.name,
      tenant: c.tenant,
      admin: isAdmin(c),
      token: c.tokenId,
    },
  };
}

/** The cookie is Secure on TLS, and behind a proxy that terminates TLS and says so. */
const secure = (req: IncomingMessage): boolean =>
  (req.socket as { encrypted?: boolean }).encrypted === true ||
  (String(req.headers["x-forwarded-proto"] ?? "").split(",")[0] ?? "").trim().toLowerCase() === "https";

const header = (req: IncomingMessage, name: string): string | undefined => {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
};

/** Whether `path` is the console's front end (its pages and assets, the icon). */
export const isConsoleAsset = (path: string): boolean =>
  path === "/console" || path.startsWith("/console/") || path === "/favicon.ico";

/** Serves a file of the console's front end (GET or HEAD). */
export async function serveConsoleAsset(
  g: Gateway,
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
): Promise<void> {
  req.resume();
  if (g.consoleDist === null) throw new ForkdError("not_found", "the console is not served by this gateway");
  const r = await serveAsset(g.consoleDist, path);
  res.writeHead(r.status, { ...r.headers, "content-length": String(r.body.length) });
  res.end(req.method === "HEAD" ? undefined : r.body);
}

/** The console's session routes (/v1/console/session, /v1/console/ticket). */
export async function consoleRoute(
  g: Gateway,
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  who: Authenticated,
): Promise<void> {
  const m = req.method;
  if (path === "/v1/console/session" && m === "GET") {
    req.resume();
    if (who.caller === ANONYMOUS) throw new ForkdError("unauthenticated", "not logged in to the console");
    return sendJson(res, 200, callerView(who.caller));
  }
  if (path === "/v1/console/session" && m === "POST") {
    // A cross-site form cannot set this header: it would log the victim in as the attacker.
    if (header(req, "x-forkd-console") !== "1") {
      req.resume();
      throw new ForkdError("forbidden", "a console login needs the X-Forkd-Console: 1 header");
    }
    const body = jsonObject(await readBody(req, 4096));
    const token = body.token;
    if (typeof token !== "string" || token.length < 1 || token.length > 512 || Object.keys(body).length !== 1)
      throw new ForkdError("invalid_argument", 'the body must be {"token": "..."}', { field: "token" });
    const remote = req.socket.remoteAddress ?? "unknown";
    const wait = g.authFailures.blockedFor(remote);
    if (wait > 0)
      throw new ForkdError(
        "rate_limited",
        `too many failed authentications from this address; retry after ${wait} s`,
        {
          reason: "auth_failures",
          retry_after_s: wait,
        },
      );
    const caller = g.auth.authenticate(`Bearer ${token}`);
    if (!caller) {
      g.authFailures.fail(remote);
      throw new ForkdError("unauthenticated", "wrong token");
    }
    const opened = g.sessions.open(token);
    return sendJson(
      res,
      200,
      { ...callerView(caller), key: opened.key },
      {
        "set-cookie": setCookie(opened.id, secure(req)),
      },
    );
  }
  if (path === "/v1/console/session" && m === "DELETE") {
    req.resume();
    return sendJson(res, 200, { ok: true }, { "set-cookie": setCookie(null, secure(req)) });
  }
  if (path === "/v1/console/ticket" && m === "POST") {
    req.resume();
    const ticket = g.sessions.ticket(cookieOf(header(req, "cookie")), header(req, KEY_HEADER));
    if (!ticket)
      throw new ForkdError("unauthenticated", "a ticket is for a console session (its cookie and key)");
    return sendJson(res, 200, { ticket });
  }
  req.resume();
  throw new ForkdError("not_found", `no route ${m ?? "?"} ${path}`);
}
