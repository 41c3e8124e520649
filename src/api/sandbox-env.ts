/**
 * The env a cell or command of a sandbox sees from the API: the sandbox-wide env (its record's
 * `env`, set when it was made: E2B's `envVars`, our SDKs' `envs`) under the request's own.
 */
import type { ReadonlySandbox } from "../sandbox/sandbox.js";

/** record.env (when the record has one) with `own` over it; undefined when both are empty. */
export function requestEnv(
  sb: ReadonlySandbox,
  own: Record<string, string> | undefined,
): Record<string, string> | undefined {
  const base = (sb.record as { env?: unknown }).env;
  const out: Record<string, string> = {};
  if (base && typeof base === "object" && !Array.isArray(base)) {
    for (const [k, v] of Object.entries(base as Record<string, unknown>)) {
      if (typeof v === "string") out[k] = v;
    }
  }
  Object.assign(out, own ?? {});
  return Object.keys(out).length > 0 ? out : undefined;
}
