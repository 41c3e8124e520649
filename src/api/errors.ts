/** The one wire error envelope: {"error": {"code", "message", "details"}} with a stable code. */
import { isAdmin } from "../access/caller.js";
import type { ApiContext } from "./env.js";
import { redactEnvelope } from "./redact.js";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { ForkdError } from "../util/errors.js";
import type { ErrorCode } from "../util/errors.js";
import type { z } from "zod";
import type { ErrorEnvelope as ErrorEnvelopeSchema } from "./contract/schemas.js";

const STATUS: Record<ErrorCode, ContentfulStatusCode> = {
  invalid_argument: 400,
  not_found: 404,
  conflict: 409,
  timeout: 504,
  unavailable: 503,
  guest_error: 502,
  agent_protocol: 502,
  vmm_error: 500,
  image_error: 500,
  snapshot_corrupt: 500,
  resource_exhausted: 429,
  unauthenticated: 401,
  forbidden: 403,
  payload_too_large: 413,
  rate_limited: 429,
  internal: 500,
};

export const statusOf = (code: ErrorCode): ContentfulStatusCode => STATUS[code];

export type ErrorEnvelope = z.infer<typeof ErrorEnvelopeSchema>;

export function toEnvelope(e: unknown): { status: ContentfulStatusCode; body: ErrorEnvelope } {
  if (e instanceof ForkdError) {
    return {
      status: statusOf(e.code),
      body: { error: { code: e.code, message: e.message, details: e.details } },
    };
  }
  return { status: 500, body: { error: { code: "internal", message: "internal error", details: {} } } };
}

/** The error reply; a tenant's tells nothing of the host's file system (./redact.ts). */
export function errorResponse(c: ApiContext, e: unknown): Response {
  const { status, body } = toEnvelope(e);
  c.set("errorCode", body.error.code);
  const caller = c.get("caller") as ApiContext["var"]["caller"] | undefined;
  const dirs = c.get("hostDirs") as ApiContext["var"]["hostDirs"] | undefined;
  if (caller && !isAdmin(caller) && dirs) return c.json(redactEnvelope(body, dirs), status);
  return c.json(body, status);
}
