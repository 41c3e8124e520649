/**
 * The REST API's guard of every /v1/sandboxes/{id} route, with Hono's own reading of {id} (the
 * one the routes act on): a sandbox the caller may not hold (src/app/scope.ts mayHold) is not
 * found; a missing or malformed id is left to the route.
 */
import type { MiddlewareHandler } from "hono";
import { isAdmin } from "../access/index.js";
import { mayHold, noSandbox } from "../app/index.js";
import type { Services } from "../app/index.js";
import type { ApiEnv } from "./env.js";

export function sandboxGuard(s: Services): MiddlewareHandler<ApiEnv> {
  return async (c, next) => {
    const caller = c.get("caller");
    const id = c.req.param("id");
    if (!isAdmin(caller) && id !== undefined) {
      let owner: string | null | undefined;
      try {
        owner = s.sandboxes.get(id).record.owner;
      } catch {
        return next();
      }
      if (!mayHold(caller, owner)) throw noSandbox(id);
    }
    return next();
  };
}
