/**
 * envd's own helper commands in the guest (find, sh, chown), run with a fixed environment:
 * never the sandbox-wide env its users set (E2B's envVars, which may hold PATH or LD_PRELOAD),
 * so a Stat, a listing or an upload cannot be broken or subverted through it.
 */
import type { AgentClient } from "../../agent/index.js";
import type { ExecRequest } from "../../agent/index.js";
import { ForkdError } from "../../util/index.js";

export const HELPER_ENV: Readonly<Record<string, string>> = {
  PATH: "/usr/sbin:/usr/bin:/sbin:/bin",
  LC_ALL: "C",
};

/** An exec request of one of envd's helpers: `internal` (no defaultEnv) with HELPER_ENV. */
export function helperExec(req: Omit<ExecRequest, "env" | "internal">): ExecRequest {
  return { ...req, env: { ...HELPER_ENV }, internal: true };
}

/** Runs a small shell script in the guest as `user`; fails with its stderr (403 for a permission). */
export async function helperSh(
  agent: AgentClient,
  user: string,
  script: string,
  args: string[],
): Promise<void> {
  let err = "";
  const h = agent.exec(
    helperExec({ argv: ["/bin/sh", "-c", script, "sh", ...args], user, timeoutMs: 30_000 }),
    { onStderr: (d) => void (err.length < 4096 && (err += d.toString("utf8"))) },
  );
  const r = await h.result;
  if (r.exitCode === 0) return;
  if (/Permission denied/.test(err))
    throw new ForkdError("forbidden", `permission denied: ${err.trim().slice(0, 300)}`, {
      errno_name: "EACCES",
    });
  if (/No such file or directory/.test(err))
    throw new ForkdError("not_found", err.trim().slice(0, 300), { errno_name: "ENOENT" });
  throw new ForkdError("guest_error", err.trim().slice(0, 500) || `exit ${r.exitCode}`);
}
