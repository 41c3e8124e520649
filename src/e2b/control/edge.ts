/**
 * The edge of E2B's control plane: the caller from its API key (X-API-Key or a bearer token; 401
 * without a valid one), E2B's heavy routes, its error shape and its metrics series. Admission
 * (failed authentications per address, the caller's rate and concurrency limits: 429 with
 * Retry-After) and the record of the call (metrics, an audit line for every mutating call,
 * refused ones included) are the application layer's (src/app/admission.ts, call-record.ts).
 */
import type { MiddlewareHandler } from "hono";
import { ADMITTED_HEADER, ANONYMOUS } from "../../access/index.js";
import type { Caller } from "../../access/index.js";
import { admit, admittedBy, authFailed, authRefusal, isMutating } from "../../app/index.js";
import { recordCall, startCall } from "../../app/index.js";
import type { CallStart } from "../../app/index.js";
import type { E2bServices } from "../context.js";
import { ForkdError } from "../../util/index.js";
import { callerOfKey, e2bOf } from "../auth.js";
import { e2bError } from "../errors.js";
import type { E2bApiContext, E2bEnv } from "./env.js";

/** Calls that start, stop or snapshot VMs: the caller's heavy slots. */
const HEAVY = /^\/(v2\/)?sandboxes(\/[^/]+\/(fork|pause|resume|connect|snapshots))?$/;
const PUBLIC = new Set(["/health"]);

export function e2bEdge(s: E2bServices): MiddlewareHandler<E2bEnv> {
  return async (c, next) => {
    const call = startCall();
    c.set("requestId", call.requestId);
    c.set("target", {});
    c.set("caller", ANONYMOUS);
    let release: (() => void) | null = null;
    let refused: Response | null = null;
    try {
      // An API key made a moment ago through another member of a cluster is known first.
      const key = keyOf(c);
      if (key) await e2bOf(s).auth.fresh(`Bearer ${key}`);
      const r = gate(s, c);
      if (r instanceof Response) return (refused = r);
      release = r;
      await next();
      return undefined;
    } finally {
      release?.();
      record(s, c, refused ?? c.res, call);
    }
  };
}

/** E2B's error reply (a refusal made at admission keeps its Retry-After). */
function reply(e: ForkdError): Response {
  const { status, body, headers } = e2bError(e);
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
function gate(s: E2bServices, c: E2bApiContext): Response | (() => void) | null {
  const path = c.req.path;
  const key = keyOf(c);
  if (PUBLIC.has(path) && key === null) return null;
  const remote = c.env?.incoming?.socket?.remoteAddress ?? "unknown";
  const blocked = authRefusal(s, remote);
  if (blocked) return reply(blocked);
  const caller: Caller | null = key === null ? null : callerOfKey(e2bOf(s).auth, key);
  if (!caller) {
    authFailed(s, remote);
    return reply(
      new ForkdError("unauthenticated", key === null ? "missing API key (X-API-Key)" : "invalid API key"),
    );
  }
  c.set("caller", admittedBy(s, caller, c.req.header(ADMITTED_HEADER)));
  const heavy = c.req.method === "POST" && HEAVY.test(path);
  try {
    return admit(s, caller, heavy);
  } catch (e) {
    if (e instanceof ForkdError) return reply(e);
    throw e;
  }
}

function record(s: E2bServices, c: E2bApiContext, res: Response, call: CallStart): void {
  const status = res.status;
  // The path with its ids as parameters: one series per route, not per sandbox.
  const route =
    "e2b:" +
    c.req.path.replace(
      /^\/(v2\/)?(sandboxes|templates)\/(?!metrics$)[^/]+/,
      (_m, v2: string | undefined, kind: string) => `/${v2 ?? ""}${kind}/{id}`,
    );
  recordCall(s, call, {
    caller: c.get("caller"),
    remote: c.env?.incoming?.socket?.remoteAddress,
    method: c.req.method,
    status,
    result: status >= 400 ? String(status) : "ok",
    target: c.get("target"),
    action: isMutating(c.req.method) ? `${c.req.method} ${route}` : null,
    series: { route, ...(status >= 500 ? { failure: { op: "e2b", reason: String(status) } } : {}) },
  });
}
