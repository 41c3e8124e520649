/**
 * The fixed environment of envd's own helper commands in the guest (find, sh, chown): never
 * the sandbox-wide env its users set (E2B's envVars, which may hold PATH or LD_PRELOAD), so a
 * Stat, a listing or an upload cannot be broken or subverted through it.
 */
import type { ExecRequest } from "../../agent/exec.js";

export const HELPER_ENV: Readonly<Record<string, string>> = {
  PATH: "/usr/sbin:/usr/bin:/sbin:/bin",
  LC_ALL: "C",
};

/** An exec request of one of envd's helpers: `internal` (no defaultEnv) with HELPER_ENV. */
export function helperExec(req: Omit<ExecRequest, "env" | "internal">): ExecRequest {
  return { ...req, env: { ...HELPER_ENV }, internal: true };
}
