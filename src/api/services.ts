/**
 * What the REST API is given: the application layer's services (src/app/services.ts) and the web
 * console it serves (absent: not served); and what differs between its listeners.
 */
import type { Authenticator } from "../access/index.js";
import type { Services } from "../app/index.js";
import type { ConsoleSessions } from "../access/index.js";

export interface ApiServices extends Services {
  /** The web console: its built front end and sessions (src/console; absent: not served). */
  console?: { dist: string; sessions: ConsoleSessions };
}

/** What differs between listeners: the unix socket serves the local admin, TCP needs tokens. */
export interface Listener {
  /** null: every caller is `local` (the unix socket); else a bearer token is required. */
  auth: Authenticator | null;
}
