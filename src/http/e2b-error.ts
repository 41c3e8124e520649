/**
 * E2B's error reply, `{"code": <HTTP status>, "message"}` (its openapi's Error), as both of
 * forkd's E2B doors answer it (a daemon's, src/e2b/, and a gateway's, src/gateway/e2b.ts): a
 * ForkdError keeps the HTTP status of its code (src/util/error-status.ts), its message (which
 * `tell` may rewrite: a tenant's is redacted of host paths) and, for a refusal that says when to
 * come back, a Retry-After; anything else is 500 "internal error", its message not told.
 */
import { ForkdError, statusOf } from "../util/index.js";

export interface E2bErrorBody {
  code: number;
  message: string;
}

export interface E2bErrorReply {
  status: number;
  body: E2bErrorBody;
  headers: Record<string, string>;
}

export function e2bErrorReply(e: unknown, tell: (message: string) => string = (m) => m): E2bErrorReply {
  if (!(e instanceof ForkdError))
    return { status: 500, body: { code: 500, message: "internal error" }, headers: {} };
  const status = statusOf(e.code);
  const wait = e.details.retry_after_s;
  return {
    status,
    body: { code: status, message: tell(e.message) },
    headers: typeof wait === "number" ? { "retry-after": String(wait) } : {},
  };
}
