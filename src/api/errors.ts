/** The one wire error envelope: {"error": {"code", "message", "details"}} with a stable code. */
import { isAdmin } from "../access/index.js";
import type { ApiContext } from "./env.js";
import { redactEnvelope } from "./redact.js";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { ForkdError } from "../util/index.js";
import { statusOf } from "../util/index.js";
import type { z } from "zod";
import type { ErrorEnvelope as ErrorEnvelopeSchema } from "./contract/schemas.js";

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
