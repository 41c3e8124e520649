/**
 * What E2B's API (src/e2b) is given besides the application layer's services: the authenticator
 * its API keys go through (the daemon's tokens), the envd access tokens, and the domain its
 * replies name. Built by the daemon's entry point when FORKD_E2B_LISTEN is set.
 */
import type { Authenticator } from "../access/index.js";
import type { Services } from "../app/index.js";
import type { AccessTokens } from "./access-token.js";

export interface E2bContext {
  auth: Authenticator;
  accessTokens: AccessTokens;
  /** E2B's `domain` in replies (FORKD_E2B_DOMAIN); null: none. */
  domain: string | null;
}

/** The services E2B's API is given: the application layer's, and its own context (absent: not served). */
export interface E2bServices extends Services {
  e2b?: E2bContext;
}
