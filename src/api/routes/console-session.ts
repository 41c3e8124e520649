/**
 * The web console's session on the daemon's TCP listener: POST /v1/console/session exchanges a
 * bearer token (checked like one, failures limited per address like the edge's) for the
 * session cookie, bound to that token (the edge re-checks it on each request: a revoked token
 * ends its sessions); GET says who is logged in; DELETE logs out. On the unix socket every
 * caller is the local admin, so GET answers that and POST needs no token.
 */
import { Hono } from "hono";
import { ANONYMOUS, LOCAL, isAdmin } from "../../access/caller.js";
import type { Caller } from "../../access/caller.js";
import { Authenticator } from "../../access/tokens.js";
import { cookieOf, setCookie } from "../../console/sessions.js";
import { ForkdError } from "../../util/errors.js";
import { ConsoleLogin } from "../contract/schemas.js";
import type { ApiContext, ApiEnv } from "../env.js";
import { parseBody } from "../parse.js";
import type { Listener, Services } from "../services.js";

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

export function consoleSessionRoutes(s: Services, listener: Listener): Hono<ApiEnv> {
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
    const sid = s.console.sessions.open(Authenticator.sessionSubject(caller));
    c.header("set-cookie", setCookie(sid, secure(c)));
    c.header("cache-control", "no-store");
    return c.json(callerView(caller));
  });

  app.delete("/", (c) => {
    s.console?.sessions.close(cookieOf(c.req.header("cookie")));
    c.header("set-cookie", setCookie(null, secure(c)));
    return c.json({ ok: true });
  });

  return app;
}
