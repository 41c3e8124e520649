/**
 * FORK AS A CALLER: children of a snapshot the caller may fork (its own namespace's or a shared
 * one; an admin any), owned by the caller's tenant and counted against its quota while they
 * start, each child's latency and each failure recorded. A fork in which every child failed is
 * an error with the first child's own code (`every child failed: …`, all failures in its
 * details); some failing is not: the reply lists them. The REST API's POST /v1/sandboxes and
 * E2B's POST /sandboxes both fork through here.
 */
import type { Caller } from "../access/index.js";
import type { ForkFailure, ForkOptions, ForkResult } from "../sandbox/index.js";
import { ForkdError } from "../util/index.js";
import { forkable, heldBy } from "./scope.js";
import type { Services } from "./services.js";

/** What a caller chooses of a fork (the owner is the caller's tenant). */
export type CallerForkOptions = Omit<ForkOptions, "owner">;

/**
 * `unknown`: the door's answer for a snapshot the caller cannot fork (one it cannot see, or a
 * malformed tag); absent: not found (or invalid) as ./scope.ts says.
 */
export async function forkAs(
  s: Services,
  caller: Caller,
  tag: string,
  n: number,
  opts: CallerForkOptions,
  unknown?: () => ForkdError,
): Promise<ForkResult> {
  const key = await forkable(s, caller, tag).catch((e: unknown) => {
    if (unknown && e instanceof ForkdError && (e.code === "not_found" || e.code === "invalid_argument"))
      throw unknown();
    throw e;
  });
  const r = await withQuota(s, caller, n, () => s.sandboxes.fork(key, n, { ...opts, owner: caller.tenant }));
  recordFork(s, r);
  if (r.sandboxes.length === 0) throw everyChildFailed(r.failures);
  return r;
}

/**
 * Runs `work` with `n` more sandboxes of the caller's tenant reserved against its quota (429 past
 * it): on this daemon, and on a node of a cluster across the cluster too, unless a gateway
 * reserved them there already (`caller.admitted`).
 */
export async function withQuota<T>(
  s: Services,
  caller: Caller,
  n: number,
  work: () => Promise<T>,
): Promise<T> {
  const release = s.limits.quota.reserve(caller, n, () => heldBy(s, caller.tenant));
  let wide: { release(): Promise<void> } | null = null;
  try {
    if (s.cluster && !caller.admitted && caller.tenant !== null && caller.maxSandboxes !== null)
      wide = await s.cluster.reserve(caller.tenant, caller.maxSandboxes, n);
    return await work();
  } finally {
    release();
    await wide?.release();
  }
}

/** Each child's latency (until its agent answered) and each failure, in the metrics. */
export function recordFork(s: Services, r: ForkResult): void {
  for (const sb of r.sandboxes) s.metrics.fork(sb.record.timings.totalMs / 1000);
  for (const f of r.failures) s.metrics.failure("fork", f.code);
}

/** The error of a fork with no child: the first failure's own code. */
export function everyChildFailed(failures: ForkFailure[]): ForkdError {
  const first = failures[0];
  return new ForkdError(first?.code ?? "internal", `every child failed: ${first?.message ?? "unknown"}`, {
    failures,
  });
}
