/**
 * ADMISSION, the same at every front door's edge: an address past its failed authentications is
 * refused before any credential is checked (429, Retry-After), a failed one counts against it;
 * a limited caller takes a slot of its rate, in-flight and (for calls that start, stop or
 * snapshot VMs) heavy limits, or is refused (429, Retry-After); the unix socket's admin and
 * FORKD_TOKEN's are not limited. Which methods change something (and so are audited) is said
 * here once.
 */
import { ANONYMOUS } from "../access/index.js";
import type { Caller } from "../access/index.js";
import { rateLimited } from "../access/index.js";
import { ForkdError } from "../util/index.js";
import type { Services } from "./services.js";

const MUTATING = new Set(["POST", "PUT", "PATCH", "DELETE"]);

/**
 * The caller as a node of a cluster sees it: marked `admitted` when the request carries the
 * cluster's X-Forkd-Admitted header (a gateway reserved its sandboxes against the tenant's
 * quota: ./fork.ts withQuota does not again). A daemon alone, and any other caller: as it is.
 */
export function admittedBy(s: Services, caller: Caller, header: string | undefined): Caller {
  if (!s.cluster || header === undefined || caller === ANONYMOUS || !s.cluster.admits(header)) return caller;
  return { ...caller, admitted: true };
}

/** Whether a request with `method` changes something (its call is audited). */
export const isMutating = (method: string): boolean => MUTATING.has(method);

/** The refusal of `remote` while it is past its failed authentications (null: it may try). */
export function authRefusal(s: Services, remote: string): ForkdError | null {
  const wait = s.limits.authFailures.blockedFor(remote);
  if (wait <= 0) return null;
  return new ForkdError(
    "rate_limited",
    `too many failed authentications from this address; retry after ${wait} s`,
    {
      reason: "auth_failures",
      retry_after_s: wait,
    },
  );
}

/** Counts a failed authentication against `remote`. */
export const authFailed = (s: Services, remote: string): void => s.limits.authFailures.fail(remote);

/**
 * Takes the caller's slots (`heavy`: a heavy one too): what frees them, or null for a caller
 * without limits. Throws rate_limited past them.
 */
export function admit(s: Services, caller: Caller, heavy: boolean): (() => void) | null {
  if (!caller.limited || caller === ANONYMOUS) return null;
  const a = s.limits.rate.admit(caller.tokenId ?? caller.name, heavy);
  if (!a.ok) throw rateLimited(a.reason, a.retryAfterS);
  return a.release;
}

/** The Retry-After of a refusal made here (undefined: it has none). */
export function retryAfter(e: ForkdError): string | undefined {
  const wait = e.details.retry_after_s;
  return typeof wait === "number" ? String(wait) : undefined;
}
