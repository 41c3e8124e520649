/**
 * What registry offers: the OCI Distribution client (references, auth challenges, credentials,
 * reachability checks, transport). Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { clientFor } from "./client.js";
export type { RegistryClient, RegistrySettings } from "./client.js";
export { assertReachable, connectCheck, parseAllowedHosts, tenantGuard } from "./reach.js";
export type { AllowedHost, Reach, Refuse, TenantGuard } from "./reach.js";
export { DIGEST_RE, formatRef, parseRef, reference } from "./ref.js";
export type { RegistryRef } from "./ref.js";
export { registrySettings } from "./settings.js";
export { bodyStream, checkScheme, discard, readLimited, send } from "./transport.js";
export type { Sent } from "./transport.js";
