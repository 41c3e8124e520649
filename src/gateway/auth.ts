/**
 * Who calls the gateway, and what it forwards for them. forkd's REST API: a bearer token, or the
 * web console's sealed session (its cookie with the page's key, or a single-use ticket on a GET
 * or a WebSocket upgrade: src/access/sealed-sessions.ts), whose token is then forwarded as the
 * bearer: nodes authenticate every relayed call themselves, the same token. E2B's control plane:
 * an API key (X-API-Key, or a bearer token). Failed authentication counts against the client's
 * address as on a daemon's TCP listener (429 past its bound, before any token is checked). The
 * gateway refuses a credential it does not know before anything is relayed, so a node never
 * counts failures against a gateway's address.
 */
import type { IncomingMessage } from "node:http";
import { ANONYMOUS, COOKIE, KEY_HEADER, TICKET_PARAM, cookieOf } from "../access/index.js";
import type { Caller } from "../access/index.js";
import { ForkdError } from "../util/index.js";
import type { Gateway } from "./context.js";

export interface Authenticated {
  caller: Caller;
  /** The Authorization header to forward (null: none, an anonymous caller). */
  authorization: string | null;
  /** The console session's cookie, when the caller came by one. */
  session: string | null;
}

const header = (req: IncomingMessage, name: string): string | undefined => {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
};

const remoteOf = (req: IncomingMessage): string => req.socket.remoteAddress ?? "unknown";

/** Refused before any token is checked: too many failures from this address. */
function blocked(g: Gateway, req: IncomingMessage): ForkdError | null {
  const wait = g.authFailures.blockedFor(remoteOf(req));
  return wait > 0
    ? new ForkdError(
        "rate_limited",
        `too many failed authentications from this address; retry after ${wait} s`,
        {
          reason: "auth_failures",
          retry_after_s: wait,
        },
      )
    : null;
}

/**
 * The REST caller of `req` (`needs`: the route is not public, so a request without a credential
 * is an attempt that failed). Throws a refusal (403, 429) where a daemon's edge refuses.
 */
export async function restCaller(
  g: Gateway,
  req: IncomingMessage,
  url: URL,
  o: { needs: boolean; upgrade: boolean },
): Promise<Authenticated> {
  const authorization = header(req, "authorization");
  if (authorization === undefined) {
    const s = await consoleSession(g, req, url, o.upgrade);
    if (s !== null) {
      const bearer = `Bearer ${s.token}`;
      const caller = g.auth.authenticate(bearer);
      // A session whose token was revoked is nobody's.
      if (caller) return { caller, authorization: bearer, session: s.id };
    }
  }
  const attempt = authorization !== undefined || o.needs;
  if (attempt) {
    const refused = blocked(g, req);
    if (refused) throw refused;
  }
  if (authorization !== undefined) await g.auth.fresh(authorization);
  const caller = authorization !== undefined ? g.auth.authenticate(authorization) : null;
  if (!caller) {
    if (attempt) g.authFailures.fail(remoteOf(req));
    return { caller: ANONYMOUS, authorization: null, session: null };
  }
  return { caller, authorization: authorization ?? null, session: null };
}

/**
 * The console session a request names (null: none live): the cookie with the session's key,
 * or for a GET, HEAD or upgrade a ticket (used up). Like a daemon's edge, a session is a
 * credential only where another site's page cannot make a browser use it with effect: a GET
 * or HEAD, a request with `X-Forkd-Console: 1`, or an upgrade from this origin (else 403).
 */
async function consoleSession(
  g: Gateway,
  req: IncomingMessage,
  url: URL,
  upgrade: boolean,
): Promise<{ id: string; token: string } | null> {
  const id = cookieOf(header(req, "cookie"), COOKIE);
  if (id === undefined) return null;
  const key = header(req, KEY_HEADER);
  const ticket = url.searchParams.get(TICKET_PARAM);
  const safe = req.method === "GET" || req.method === "HEAD";
  const s =
    key !== undefined
      ? g.sessions.get(id, key)
      : ticket !== null && (upgrade || safe)
        ? await g.sessions.redeemTicket(id, ticket, (t, exp) => g.tickets.use(t, exp))
        : null;
  if (!s) return null;
  const host = header(req, "host");
  const origin = header(req, "origin");
  const sameOrigin = host !== undefined && (origin === `http://${host}` || origin === `https://${host}`);
  const ok = upgrade ? sameOrigin : safe || header(req, "x-forkd-console") === "1";
  if (!ok)
    throw new ForkdError(
      "forbidden",
      upgrade
        ? "a console WebSocket must come from the console's own origin"
        : "console requests need the X-Forkd-Console: 1 header",
    );
  return { id, token: s.token };
}

/** The E2B caller of `req`: its API key (X-API-Key, else a bearer token); 401 without a valid one. */
export async function e2bCaller(g: Gateway, req: IncomingMessage): Promise<Authenticated> {
  const refused = blocked(g, req);
  if (refused) throw refused;
  const apiKey = header(req, "x-api-key")?.trim();
  const bearer = /^Bearer +(\S+) *$/i.exec(header(req, "authorization") ?? "")?.[1];
  const key = apiKey || bearer;
  if (key && key.length <= 512) await g.auth.fresh(`Bearer ${key}`);
  const caller = key && key.length <= 512 ? g.auth.authenticate(`Bearer ${key}`) : null;
  if (!caller) {
    g.authFailures.fail(remoteOf(req));
    throw new ForkdError("unauthenticated", "missing or invalid API key");
  }
  return { caller, authorization: `Bearer ${key}`, session: null };
}
