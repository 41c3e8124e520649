/** The HTTP status of each error code, the same on every front door (docs/api.md, "Errors"). */
import type { ErrorCode } from "./errors.js";

export type ErrorStatus = 400 | 401 | 403 | 404 | 409 | 413 | 429 | 500 | 502 | 503 | 504;

const STATUS: Record<ErrorCode, ErrorStatus> = {
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

export const statusOf = (code: ErrorCode): ErrorStatus => STATUS[code];
