/**
 * The edge every request passes before any route: it names the request (id, contract route),
 * finds its caller (the unix socket's local admin, or on TCP a bearer token or the web console's
 * session (its cookie and the page's key), with failed authentication limited per remote address), refuses what the caller may not do (401, 403),
 * applies the caller's limits (429: src/app/admission.ts) and the body's bound (413),
 * and afterwards records the call (src/app/call-record.ts): latency and failures in the metrics, and an audit line for
 * every mutating call (and WebSocket), refused ones included. A streamed reply or a WebSocket is
 * registered with the credential that opened it, and ended when that is revoked (./revocable.ts).
 */
import type { MiddlewareHandler } from "hono";
import { ADMITTED_HEADER, ANONYMOUS, LOCAL, isAdmin } from "../access/index.js";
import type { Caller } from "../access/index.js";
import type { EndOpened } from "../access/index.js";
import { admit, admittedBy, authFailed, authRefusal, isMutating, retryAfter } from "../app/index.js";
import { recordCall, startCall } from "../app/index.js";
import type { CallStart } from "../app/index.js";
import { KEY_HEADER, TICKET_PARAM, cookieOf } from "../access/index.js";
import { ForkdError } from "../util/index.js";
import type { ApiContext, ApiEnv } from "./env.js";
import { errorResponse } from "./errors.js";
import { redactNdjson } from "./redact.js";
import { tooLarge } from "../app/index.js";
import { revocableReply, revocableUpgrade } from "./revocable.js";
import { actionOf, matchRoute } from "./route-match.js";
import type { ApiServices, Listener } from "./services.js";

/** Replies that go on after the handler returned (their in-flight slot is held until they end). */
const STREAMED = /^(application\/(x-ndjson|octet-stream|zstd)|text\/event-stream)/;
const NDJSON = /^application\/x-ndjson/;

export function edge(s: ApiServices, listener: Listener): MiddlewareHandler<ApiEnv> {
  return async (c, next) => {
    const call = startCall();
    c.set("requestId", call.requestId);
    c.set("target", {});
    c.set("hostDirs", s.info.hostDirs);
    const match = matchRoute(c.req.method, c.req.path);
    await listener.auth?.fresh(c.req.header("authorization"));
    const caller = callerOf(s, c, listener, match);
    if (caller instanceof Response) {
      record(s, c, caller, ANONYMOUS, call);
      return caller;
    }
    c.set("caller", caller);
    let early: Response | undefined;
    let release: (() => void) | null = null;
    try {
      const refused = gate(s, c, caller, match);
      if (refused instanceof Response) return (early = refused);
      release = refused;
      // What the caller opens is ended when its credential is revoked (a terminal, a stream).
      const opened = listener.auth?.tokens.opened;
      const register = (end: EndOpened) => opened?.open(caller.credential, end) ?? (() => undefined);
      const upgrade = c.env?.wsUpgrade;
      if (upgrade && caller.credential) revocableUpgrade(upgrade, register);
      await next();
      // A tenant's NDJSON reply names no host path in its messages (./redact.ts).
      const streamed = c.res.body;
      if (streamed && !isAdmin(caller) && NDJSON.test(c.res.headers.get("content-type") ?? ""))
        c.res = new Response(streamed.pipeThrough(redactNdjson(s.info.hostDirs)), c.res);
      // A streamed reply holds its caller's in-flight slot until it ends or the client goes, and
      // is ended if the credential that opened it is revoked.
      const body = c.res.body;
      const type = c.res.headers.get("content-type") ?? "";
      if (body && STREAMED.test(type) && (release || caller.credential)) {
        const done = release ?? (() => undefined);
        release = null;
        c.res = new Response(body.pipeThrough(revocableReply(type, register, done)), c.res);
      }
      return undefined;
    } finally {
      release?.();
      record(s, c, early ?? c.res, caller, call);
    }
  };
}

/**
 * The caller: the socket's local admin, or on TCP its token's (ANONYMOUS without a valid one).
 * A request that presents a credential, or needs one, is an attempt to authenticate: a failed
 * one counts against its remote address, and an address past its failures is refused (the 429
 * returned here) before any token is checked, so that reply tells nothing about the token.
 */
function callerOf(
  s: ApiServices,
  c: ApiContext,
  listener: Listener,
  match: ReturnType<typeof matchRoute>,
): Caller | Response {
  if (listener.auth === null) return LOCAL;
  const header = c.req.header("authorization");
  // The web console's session cookie (routes/console-session.ts), on TCP only, for its token.
  const session = header === undefined ? consoleSession(s, c) : null;
  if (session instanceof Response) return session;
  if (session !== null) {
    const caller = listener.auth.sessionCaller(session.subject);
    if (caller) return caller;
    s.console?.sessions.close(session.id); // its token was revoked
  }
  const attempt = header !== undefined || (match !== null && !match.spec.public);
  const remote = c.env?.incoming?.socket?.remoteAddress ?? "unknown";
  const blocked = attempt ? authRefusal(s, remote) : null;
  if (blocked) {
    c.set("caller", ANONYMOUS);
    if (match) {
      c.set("route", match.spec);
      c.set("target", { ...match.params });
    }
    c.header("retry-after", retryAfter(blocked));
    return errorResponse(c, blocked);
  }
  const caller = listener.auth.authenticate(header) ?? ANONYMOUS;
  if (caller === ANONYMOUS && attempt) authFailed(s, remote);
  return admittedBy(s, caller, c.req.header(ADMITTED_HEADER));
}

/**
 * The console session a request names (null: none, or not a live one): its cookie with the
 * session's key (X-Forkd-Console-Key), or for a GET, HEAD or WebSocket upgrade with a ticket
 * (`?console_ticket=`, used up here). The cookie alone is nothing: a browser sends it to every
 * port of this host, a tenant's exposed guest port too (access/console-sessions.ts). Once named, the
 * session is a credential only where a page of another site cannot make the browser use it with
 * effect: a GET or HEAD, a request with the console's `X-Forkd-Console: 1` header (which a
 * cross-site page cannot add without CORS, which the daemon never grants), or a WebSocket
 * upgrade whose Origin is this listener's own. Else 403.
 */
function consoleSession(s: ApiServices, c: ApiContext): { id: string; subject: string } | Response | null {
  if (!s.console) return null;
  const id = cookieOf(c.req.header("cookie"));
  if (id === undefined) return null;
  const upgrade = c.env?.wsUpgrade !== undefined;
  const key = c.req.header(KEY_HEADER);
  const ticket = c.req.query(TICKET_PARAM);
  const session =
    key !== undefined
      ? s.console.sessions.get(id, key)
      : ticket !== undefined && (upgrade || c.req.method === "GET" || c.req.method === "HEAD")
        ? s.console.sessions.redeemTicket(id, ticket)
        : null;
  if (!session || session.subject === null) return null;
  const host = c.req.header("host");
  const origin = c.req.header("origin");
  const sameOrigin = host !== undefined && (origin === `http://${host}` || origin === `https://${host}`);
  const ok = upgrade
    ? sameOrigin
    : c.req.method === "GET" || c.req.method === "HEAD" || c.req.header("x-forkd-console") === "1";
  if (ok) return { id, subject: session.subject };
  c.set("caller", ANONYMOUS);
  return errorResponse(
    c,
    new ForkdError(
      "forbidden",
      upgrade
        ? "a console WebSocket must come from the console's own origin"
        : "console requests need the X-Forkd-Console: 1 header",
    ),
  );
}

/**
 * Refuses what this caller may not do here, as the reply to send; else admits the request and
 * returns what frees its limits' slots (null when it has none).
 */
function gate(
  s: ApiServices,
  c: ApiContext,
  caller: Caller,
  match: ReturnType<typeof matchRoute>,
): Response | (() => void) | null {
  if (!match) return errorResponse(c, new ForkdError("not_found", `no route ${c.req.method} ${c.req.path}`));
  const spec = match.spec;
  c.set("route", spec);
  c.set("target", { ...match.params });
  if (caller === ANONYMOUS && !spec.public) {
    c.header("www-authenticate", 'Bearer realm="forkd"');
    return errorResponse(c, new ForkdError("unauthenticated", "missing or wrong bearer token"));
  }
  if (spec.admin && !isAdmin(caller)) {
    return errorResponse(c, new ForkdError("forbidden", `${actionOf(spec)} is for admin callers only`));
  }
  const limit = s.limits.body[spec.limit ?? "json"];
  c.set("bodyLimit", limit);
  const declared = Number(c.req.header("content-length") ?? "0");
  if (declared > limit) return errorResponse(c, tooLarge(limit));
  try {
    return admit(s, caller, spec.heavy === true);
  } catch (e) {
    if (e instanceof ForkdError) c.header("retry-after", retryAfter(e));
    return errorResponse(c, e);
  }
}

function record(s: ApiServices, c: ApiContext, res: Response, caller: Caller, call: CallStart): void {
  const spec = c.get("route") as ApiContext["var"]["route"] | undefined;
  const status = res.status;
  const code = status >= 400 ? ((c.get("errorCode") as string | undefined) ?? "internal") : null;
  // A WebSocket (a terminal) is audited like a call that changes something.
  const audited = isMutating(c.req.method) || c.env?.wsUpgrade !== undefined;
  recordCall(s, call, {
    caller,
    remote: c.env?.incoming?.socket?.remoteAddress,
    method: c.req.method,
    status,
    result: code ?? "ok",
    target: c.get("target"),
    action: audited ? (spec ? actionOf(spec) : `${c.req.method} (no route)`) : null,
    series: {
      route: spec ? spec.path : "(no route)",
      ...(code !== null && spec ? { failure: { op: spec.operationId, reason: code } } : {}),
    },
  });
}
