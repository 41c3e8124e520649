/** The refusal of a caller past its rate or concurrency limits (429 with Retry-After), for every API edge. */
import { ForkdError } from "../util/index.js";

export type RateReason = "rate" | "inflight" | "heavy";

const WHY: Record<RateReason, string> = {
  rate: "too many requests",
  inflight: "too many requests in flight",
  heavy: "too many heavy operations in flight",
};

export function rateLimited(reason: RateReason, retryAfterS: number): ForkdError {
  return new ForkdError("rate_limited", `${WHY[reason]} for this caller; retry after ${retryAfterS} s`, {
    reason,
    retry_after_s: retryAfterS,
  });
}
