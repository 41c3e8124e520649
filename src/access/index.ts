/**
 * What access offers: callers (admin or tenant), API tokens and their store, console sessions,
 * rate limits, tenant quotas and build caps, and the registry of what a credential holds open.
 * Other folders import this folder through this file alone (test/unit/layering.test.ts).
 */
export { AuthFailureLimiter } from "./auth-failures.js";
export type { AuthFailureLimits } from "./auth-failures.js";
export { DEFAULT_BUILD_CAPS, buildCapsOf, checkBuildSize } from "./build-caps.js";
export { ADMITTED_HEADER, ADMITTED_PURPOSE, ClusterSecret, PEER_PURPOSE } from "./cluster-secret.js";
export { ANONYMOUS, LOCAL, isAdmin } from "./caller.js";
export type { BuildCaps, Caller } from "./caller.js";
export {
  COOKIE,
  ConsoleSessions,
  KEY_HEADER,
  TICKET_PARAM,
  cookieOf,
  loopbackCookie,
  setCookie,
} from "./console-sessions.js";
export type { ConsoleSession } from "./console-sessions.js";
export { MIN_CLUSTER_SECRET, SEALED_SESSION_TTL_MS, SealedSessions } from "./sealed-sessions.js";
export { OpenStreams } from "./open-streams.js";
export type { EndOpened } from "./open-streams.js";
export { SandboxQuota } from "./quota.js";
export { RateLimiter } from "./rate-limit.js";
export type { RateLimits } from "./rate-limit.js";
export { rateLimited } from "./rate-refusal.js";
export { Authenticator, TOKEN_ID_RE, TenantName, TokenScope, TokenStore, weakTokenReason } from "./tokens.js";
export { MAX_TOKENS, TokenEntry, checkUnique } from "./token-entry.js";
export type { TokenBacking } from "./token-entry.js";
