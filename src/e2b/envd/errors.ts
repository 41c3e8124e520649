/**
 * forkd's errors as envd's: a Connect error code for the RPC services (what E2B's SDK turns into
 * its NotFoundError, InvalidArgumentError, ...) and an HTTP status with envd's `{code, message}`
 * body for the /files routes.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { ForkdError } from "../../util/index.js";
import type { ErrorCode } from "../../util/index.js";

/** The guest's errno name a ForkdError carries (guest-error.ts), if any. */
const errnoOf = (e: ForkdError): string | undefined =>
  typeof e.details.errno_name === "string" ? e.details.errno_name : undefined;

const CONNECT: Record<ErrorCode, Code> = {
  invalid_argument: Code.InvalidArgument,
  not_found: Code.NotFound,
  conflict: Code.FailedPrecondition,
  timeout: Code.DeadlineExceeded,
  unavailable: Code.Unavailable,
  guest_error: Code.Internal,
  agent_protocol: Code.Internal,
  vmm_error: Code.Internal,
  image_error: Code.Internal,
  snapshot_corrupt: Code.Internal,
  resource_exhausted: Code.ResourceExhausted,
  unauthenticated: Code.Unauthenticated,
  forbidden: Code.PermissionDenied,
  payload_too_large: Code.ResourceExhausted,
  rate_limited: Code.ResourceExhausted,
  internal: Code.Internal,
};

/** The Connect code of a forkd error (an errno refines it: EEXIST, EACCES, EPERM). */
export function connectCode(e: ForkdError): Code {
  switch (errnoOf(e)) {
    case "EEXIST":
      return Code.AlreadyExists;
    case "EACCES":
    case "EPERM":
      return Code.PermissionDenied;
  }
  return CONNECT[e.code];
}

/** Any failure as the ConnectError a handler throws; what is not a ForkdError says nothing. */
export function toConnectError(e: unknown): ConnectError {
  if (e instanceof ConnectError) return e;
  if (e instanceof ForkdError) return new ConnectError(e.message, connectCode(e));
  return new ConnectError("internal error", Code.Internal);
}

const HTTP: Partial<Record<ErrorCode, number>> = {
  invalid_argument: 400,
  not_found: 404,
  conflict: 409,
  unauthenticated: 401,
  forbidden: 403,
  payload_too_large: 413,
  rate_limited: 429,
  timeout: 504,
  unavailable: 502,
};

/** envd's HTTP error: its status and `{code, message}` body (507 for a full disk). */
export function httpError(e: unknown): { status: number; body: { code: number; message: string } } {
  if (!(e instanceof ForkdError)) return { status: 500, body: { code: 500, message: "internal error" } };
  let status = HTTP[e.code] ?? 500;
  const errno = errnoOf(e);
  if (errno === "ENOSPC") status = 507;
  else if (errno === "EACCES" || errno === "EPERM") status = 403;
  return { status, body: { code: status, message: e.message } };
}
