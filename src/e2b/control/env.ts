/** What every request of E2B's control plane carries once its edge (edge.ts) has seen it. */
import type { HttpBindings } from "@hono/node-server";
import type { Context } from "hono";
import type { Caller } from "../../access/index.js";

export interface E2bVariables {
  caller: Caller;
  requestId: string;
  /** What the call named or made, for the audit log. */
  target: Record<string, string | string[]>;
}

export type E2bEnv = { Bindings: Partial<HttpBindings>; Variables: E2bVariables };
export type E2bApiContext = Context<E2bEnv>;

export function noteE2bTarget(c: E2bApiContext, key: string, value: string | string[]): void {
  c.set("target", { ...c.get("target"), [key]: value });
}
