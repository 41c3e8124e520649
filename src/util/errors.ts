/**
 * Local errors with stable string codes. The API maps each code to one HTTP status and one wire
 * envelope (src/api/errors.ts); `cause` is kept for logs.
 */
export type ErrorCode =
  | "invalid_argument"
  | "not_found"
  | "conflict"
  | "timeout"
  | "unavailable"
  | "guest_error"
  | "agent_protocol"
  | "vmm_error"
  | "image_error"
  | "snapshot_corrupt"
  | "resource_exhausted"
  | "unauthenticated"
  | "forbidden"
  | "payload_too_large"
  | "rate_limited"
  | "internal";

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
