/**
 * Local errors with stable string codes. Every front door maps each code to one HTTP status
 * (./error-status.ts); the REST API to one wire envelope too (src/api/errors.ts). `cause` is kept
 * for logs. The wire's `error.code` is an enum of ERROR_CODES (src/api/contract/schemas.ts), so a
 * new code is a change of the API.
 */
export const ERROR_CODES = [
  "invalid_argument",
  "not_found",
  "conflict",
  "timeout",
  "unavailable",
  "guest_error",
  "agent_protocol",
  "vmm_error",
  "image_error",
  "snapshot_corrupt",
  "resource_exhausted",
  // Mostly the API edge's (src/api/edge.ts, parse.ts, scope.ts): a request refused as such.
  "unauthenticated",
  "forbidden",
  "payload_too_large",
  "rate_limited",
  "internal",
] as const;

/** Every code an error may carry: the one list the wire's error schema is made from. */
export type ErrorCode = (typeof ERROR_CODES)[number];

export class ForkdError extends Error {
  readonly code: ErrorCode;
  readonly details: Record<string, unknown>;

  constructor(code: ErrorCode, message: string, details: Record<string, unknown> = {}, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = "ForkdError";
    this.code = code;
    this.details = details;
  }
}

export const isForkdError = (e: unknown): e is ForkdError => e instanceof ForkdError;

/** The message of anything thrown, for logs and wrapped errors. */
export function errorMessage(e: unknown): string {
  if (e instanceof Error) return e.message;
  return String(e);
}
