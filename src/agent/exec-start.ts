/**
 * Why a command did not start, in the caller's terms. The guest agent reports a failed start as
 * "cannot start PROGRAM: strerror" with the errno of whichever step failed in the child: the
 * chdir to `cwd` or the exec. A missing or unusable `cwd` would then read as a missing shell; the
 * host asks the guest about `cwd` (only when a start failed) and says which it was.
 */
import { ForkdError } from "../util/index.js";
import { errnoName } from "./errno.js";
import type { AgentClient } from "./client.js";
import type { ExecHandle, ExecRequest } from "./exec.js";

/** Errnos of chdir that a bad `cwd` gives (ENOENT, EACCES, ENOTDIR, ELOOP, ENAMETOOLONG). */
const CHDIR_ERRNOS = new Set([2, 13, 20, 40, 36]);

export async function explainStartFailure(
  agent: AgentClient,
  req: ExecRequest,
  e: unknown,
): Promise<unknown> {
  if (!(e instanceof ForkdError) || req.cwd === undefined || !/^cannot start /.test(e.message)) return e;
  const errno = Number(e.details.errno);
  if (!CHDIR_ERRNOS.has(errno)) return e;
  const bad = (what: string, name: string) =>
    new ForkdError("invalid_argument", `cwd ${req.cwd} ${what} in the sandbox (${name})`, {
      field: "cwd",
      cwd: req.cwd,
      errno: e.details.errno,
      errno_name: name,
    });
  try {
    const st = await agent.stat(req.cwd, 5_000);
    // A directory: the program itself is what failed (EACCES: it may not be executable).
    return st.type === "dir" ? e : bad("is not a directory", "ENOTDIR");
  } catch (se) {
    if (se instanceof ForkdError && se.details.errno === 2) return bad("does not exist", "ENOENT");
    if (se instanceof ForkdError && typeof se.details.errno === "number")
      return bad("cannot be used", errnoName(se.details.errno));
    return e; // the guest could not say: keep its own words
  }
}

/**
 * `h` whose result (and start) fail with explainStartFailure's error, then `more`'s (the
 * caller's own explanation: e.g. the sandbox ended under the command).
 */
export function withStartExplained(
  agent: AgentClient,
  req: ExecRequest,
  h: ExecHandle,
  more: (e: unknown) => Promise<unknown> = async (e) => e,
): ExecHandle {
  const explain = async (e: unknown) => more(await explainStartFailure(agent, req, e));
  const result = h.result.catch(async (e: unknown) => {
    throw await explain(e);
  });
  const started = h.started.catch(async (e: unknown) => {
    throw await explain(e);
  });
  started.catch(() => undefined); // observed through `result` too
  return { ...h, result, started };
}
