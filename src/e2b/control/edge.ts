/**
 * The edge of E2B's control plane, as forkd's own (src/api/edge.ts) for its API: the caller from
 * its API key (X-API-Key or a bearer token; failed ones limited per remote address, 401 without a
 * valid one), the caller's rate and concurrency limits (429 with Retry-After), and afterwards the
 * metrics and an audit line for every mutating call, refused ones included.
 */
import { randomUUID } from "node:crypto";
import type { MiddlewareHandler } from "hono";
import { ANONYMOUS } from "../../access/caller.js";
import type { Caller } from "../../access/caller.js";
import { rateLimited } from "../../access/rate-refusal.js";
import { auditLine } from "../../audit/audit-line.js";
import type { E2bServices } from "../context.js";
import { ForkdError } from "../../util/errors.js";
import { callerOfKey, e2bOf } from "../auth.js";
import { e2bError } from "../errors.js";
import type { E2bApiContext, E2bEnv } from "./env.js";

const MUTATING = new Set(["POST", "PUT", "PATCH", "DELETE"]);
/** Calls that start, stop or snapshot VMs: the caller's heavy slots. */
const HEAVY = /^\/(v2\/)?sandboxes(\/[^/]+\/(fork|pause|resume|connect|snapshots))?$/;
const PUBLIC = new Set(["/health"]);

export function e2bEdge(s: E2bServices): MiddlewareHandler<E2bEnv> {
  return async (c, next) => {
    const t0 = performance.now();
    const started = new Date();
    c.set("requestId", randomUUID());
    c.set("target", {});
    c.set("caller", ANONYMOUS);
    let release: (() => void) | null = null;
    let refused: Response | null = null;
    try {
      const r = admit(s, c);
      if (r instanceof Response) return (refused = r);
      release = r;
      await next();
      return undefined;
    } finally {
      release?.();
      record(s, c, refused ?? c.res, started, t0);
    }
  };
}

function reply(c: E2bApiContext, e: ForkdError, headers: Record<string, string> = {}): Response {
  const { status, body } = e2bError(e);
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

function keyOf(c: E2bApiContext): string | null {
  const key = c.req.header("x-api-key")?.trim();
  if (key) return key.length > 512 ? "" : key;
  const m = /^Bearer +(\S+) *$/i.exec(c.req.header("authorization") ?? "");
  return m?.[1] ?? null;
}

/** The request's caller and its limits' release, or the refusal to send. */
function admit(s: E2bServices, c: E2bApiContext): Response | (() => void) | null {
  const path = c.req.path;
  const key = keyOf(c);
  if (PUBLIC.has(path) && key === null) return null;
  const remote = c.env?.incoming?.socket?.remoteAddress ?? "unknown";
  const wait = s.limits.authFailures.blockedFor(remote);
  if (wait > 0)
    return reply(
      c,
      new ForkdError(
        "rate_limited",
        `too many failed authentications from this address; retry after ${wait} s`,
      ),
      { "retry-after": String(wait) },
    );
  const caller: Caller | null = key === null ? null : callerOfKey(e2bOf(s).auth, key);
  if (!caller) {
    s.limits.authFailures.fail(remote);
    return reply(
      c,
      new ForkdError("unauthenticated", key === null ? "missing API key (X-API-Key)" : "invalid API key"),
    );
  }
  c.set("caller", caller);
  const heavy = c.req.method === "POST" && HEAVY.test(path);
  const a = s.limits.rate.admit(caller.tokenId ?? caller.name, heavy);
  if (a.ok) return a.release;
  return reply(c, rateLimited(a.reason, a.retryAfterS), {
    "retry-after": String(a.retryAfterS),
  });
}

function record(s: E2bServices, c: E2bApiContext, res: Response, started: Date, t0: number): void {
  const seconds = (performance.now() - t0) / 1000;
  const status = res.status;
  const caller = c.get("caller");
  // The path with its ids as parameters: one series per route, not per sandbox.
  const route =
    "e2b:" +
    c.req.path.replace(
      /^\/(v2\/)?(sandboxes|templates)\/(?!metrics$)[^/]+/,
      (_m, v2: string | undefined, kind: string) => `/${v2 ?? ""}${kind}/{id}`,
    );
  const action = `${c.req.method} ${route}`;
  s.metrics.http(route, c.req.method, status, seconds);
  if (status >= 500) s.metrics.failure("e2b", String(status));
  if (!MUTATING.has(c.req.method)) return;
  s.audit.append(
    auditLine({
      started,
      requestId: c.get("requestId"),
      caller,
      remote: c.env?.incoming?.socket?.remoteAddress,
      action,
      target: c.get("target"),
      status,
      result: status >= 400 ? String(status) : "ok",
      durationMs: seconds * 1000,
    }),
  );
}
