/**
 * Finds the contract's route for a request before Hono routes it, so the edge (auth, limits,
 * audit, metrics) knows what is being called: its template, whether it is admin-only or heavy,
 * its body's bound, and its path parameters.
 */
import { ROUTES } from "./contract/routes.js";
import type { RouteSpec } from "./contract/routes.js";

export interface RouteMatch {
  spec: RouteSpec;
  /** Path parameters by name, as sent (validated later by the route). */
  params: Record<string, string>;
}

interface Compiled {
  spec: RouteSpec;
  re: RegExp;
  names: string[];
}

/** Literal paths before templated ones, so /v1/snapshots/unpack is never taken for a tag. */
const COMPILED: Compiled[] = ROUTES.map((spec) => {
  const names: string[] = [];
  const re = new RegExp(
    "^" +
      spec.path.replace(/\./g, "\\.").replace(/\{(\w+)\}/g, (_m, name: string) => {
        names.push(name);
        return "([^/]+)";
      }) +
      "/?$",
  );
  return { spec, re, names };
}).sort((a, b) => a.names.length - b.names.length);

export function matchRoute(method: string, path: string): RouteMatch | null {
  const m = method.toLowerCase() === "head" ? "get" : method.toLowerCase();
  for (const c of COMPILED) {
    if (c.spec.method !== m) continue;
    const hit = c.re.exec(path);
    if (!hit) continue;
    const params: Record<string, string> = {};
    c.names.forEach((n, i) => {
      const v = hit[i + 1] ?? "";
      try {
        params[n] = decodeURIComponent(v);
      } catch {
        params[n] = v;
      }
    });
    return { spec: c.spec, params };
  }
  return null;
}

/** "POST /v1/sandboxes/{id}/exec": how audit lines and metrics name an operation. */
export const actionOf = (spec: RouteSpec): string => `${spec.method.toUpperCase()} ${spec.path}`;
