/**
 * The web console's session on the daemon's TCP listener: POST /v1/console/session exchanges a
 * bearer token (checked like one, failures limited per address like the edge's) for a session
 * bound to that token (the edge re-checks it on each request: a revoked token ends its
 * sessions): the cookie, and in the reply's body the key the page sends with every call (the
 * cookie alone opens nothing: access/console-sessions.ts); GET says who is logged in; DELETE logs out;
 * POST /v1/console/ticket gives a single-use ticket for a URL (EventSource, WebSocket, download).
 * On the unix socket every caller is the local admin, so GET answers that and POST needs no token.
 */
import { Hono } from "hono";
import { ANONYMOUS, LOCAL, isAdmin } from "../../access/index.js";
import type { Caller } from "../../access/index.js";
import { Authenticator } from "../../access/index.js";
import { KEY_HEADER, cookieOf, setCookie } from "../../access/index.js";
import { ForkdError } from "../../util/index.js";
import { ConsoleLogin } from "../contract/schemas.js";
import type { ApiContext, ApiEnv } from "../env.js";
import { parseBody } from "../parse.js";
import type { ApiServices, Listener } from "../services.js";

function callerView(c: Caller): unknown {
  return {
    caller: {
      kind: c === LOCAL ? "local" : c.tokenId === null ? "admin" : "token",
      name: c.name,
      tenant: c.tenant,
      admin: isAdmin(c),
      token: c.tokenId,
    },
  };
}

/**
 * The cookie is Secure on TLS, and behind a proxy that terminates TLS and says so
 * (X-Forwarded-Proto: https). A client that sends that header over plain HTTP only keeps its
 * own browser from sending the cookie back.
 */
const secure = (c: ApiContext): boolean =>
  (c.env?.incoming?.socket as { encrypted?: boolean } | undefined)?.encrypted === true ||
  (c.req.header("x-forwarded-proto") ?? "").split(",")[0]?.trim().toLowerCase() === "https";

export function consoleSessionRoutes(s: ApiServices, listener: Listener): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.get("/", (c) => {
    const caller = c.get("caller");
    if (caller === ANONYMOUS) throw new ForkdError("unauthenticated", "not logged in to the console");
    return c.json(callerView(caller));
  });

  app.post("/", async (c) => {
    // A cross-site form can post a JSON-looking text/plain body but cannot set this header: it
    // would log the victim's browser in as the attacker (login CSRF).
    if (c.req.header("x-forkd-console") !== "1")
      throw new ForkdError("forbidden", "a console login needs the X-Forkd-Console: 1 header");
    const { token } = await parseBody(c, ConsoleLogin);
    const auth = listener.auth;
    if (auth === null) return c.json(callerView(LOCAL));
    const remote = c.env?.incoming?.socket?.remoteAddress ?? "unknown";
    const wait = s.limits.authFailures.blockedFor(remote);
    if (wait > 0) {
      c.header("retry-after", String(wait));
      throw new ForkdError(
        "rate_limited",
        `too many failed authentications from this address; retry after ${wait} s`,
        {
          reason: "auth_failures",
          retry_after_s: wait,
        },
      );
    }
    const caller = auth.authenticate(`Bearer ${token}`);
    if (!caller || !s.console) {
      s.limits.authFailures.fail(remote);
      throw new ForkdError("unauthenticated", "wrong token");
    }
    const opened = s.console.sessions.open(Authenticator.sessionSubject(caller));
    c.header("set-cookie", setCookie(opened.id, secure(c)));
    c.header("cache-control", "no-store");
    return c.json({ ...(callerView(caller) as object), key: opened.key });
  });

  app.delete("/", (c) => {
    // Only the page that holds the session (its key too) ends it; a cookie alone does nothing.
    const id = cookieOf(c.req.header("cookie"));
    if (s.console?.sessions.get(id, c.req.header(KEY_HEADER))) s.console.sessions.close(id);
    c.header("set-cookie", setCookie(null, secure(c)));
    return c.json({ ok: true });
  });

  return app;
}

/** POST /v1/console/ticket: a single-use ticket (60 s) for this console session's URLs. */
export function consoleTicketRoutes(s: ApiServices): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();
  app.post("/", (c) => {
    const ticket = s.console?.sessions.ticket(cookieOf(c.req.header("cookie")), c.req.header(KEY_HEADER));
    if (!ticket)
      throw new ForkdError("unauthenticated", "a ticket is for a console session (its cookie and key)");
    c.header("cache-control", "no-store");
    return c.json({ ticket });
  });

  return app;
}
