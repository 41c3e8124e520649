/** What every request carries through the API once the edge has seen it (Hono context variables). */
import type { Context } from "hono";
import type { HttpBindings } from "@hono/node-server";
import type { Caller } from "../access/index.js";
import type { RouteSpec } from "./contract/routes.js";
import type { HostDirs } from "../app/index.js";
import type { WsUpgrade } from "../http/index.js";

export interface ApiVariables {
  caller: Caller;
  /** The contract's route being called. */
  route: RouteSpec;
  requestId: string;
  /** The request body's bound in bytes (BodyLimits, by the route's `limit`). */
  bodyLimit: number;
  /** What the call names or made, for its audit line. */
  target: Record<string, string | string[]>;
  /** The error code of the reply, when it is an error (set by errorResponse). */
  errorCode: string;
  /** The daemon's directories by logical name: hidden from tenants in errors (src/app/redact.ts). */
  hostDirs: HostDirs;
}

/**
 * Bindings are absent when the app is called directly (app.request in tests); `wsUpgrade` is
 * there only for a WebSocket upgrade (./ws-upgrade.ts).
 */
export type ApiEnv = { Bindings: Partial<HttpBindings> & { wsUpgrade?: WsUpgrade }; Variables: ApiVariables };
export type ApiContext = Context<ApiEnv>;

/** Records what a call made (ids it created), for its audit line. */
export function noteTarget(c: ApiContext, key: string, value: string | string[]): void {
  c.set("target", { ...c.get("target"), [key]: value });
}
