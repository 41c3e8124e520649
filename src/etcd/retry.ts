/**
 * Which failed etcd calls are tried again, and the loop that does it (./etcd-kv.ts). While etcd
 * elects a leader its members answer `leader changed` or `no leader`, and a member being killed
 * refuses connections: a read, a put or a delete is then tried again (each does on a retry what
 * it would have done once) until the call's deadline; a transaction only on an answer that says
 * it was not applied (`no leader`: refused before any proposal; no connection made), since a
 * compare-and-swap applied before `leader changed` would fail its compare on a retry and tell
 * its caller a conflict that is its own write.
 */
import { sleep } from "../util/index.js";
import { errorMessage } from "../util/index.js";

/** Answers during an election or a member's death, after which the call may have been applied. */
const TRANSIENT =
  /leader changed|no leader|UNAVAILABLE|ECONNREFUSED|ECONNRESET|GRPCConnectFailed|unhealthy|read index/i;
/** Answers after which the call was certainly not applied. */
const NOT_APPLIED = /no leader|ECONNREFUSED|GRPCConnectFailed/i;

export type CallKind = "idempotent" | "txn";

/** Whether a call of `kind` that failed with `e` is tried again. */
export function retryable(kind: CallKind, e: unknown): boolean {
  const m = errorMessage(e);
  return kind === "idempotent" ? TRANSIENT.test(m) : NOT_APPLIED.test(m);
}

/**
 * Runs `f` until it succeeds, fails for good, or `ms` have passed (the last failure then
 * thrown); backs off 100, 200, 400, 500, 500... ms between tries.
 */
export async function withRetries<T>(kind: CallKind, ms: number, f: () => Promise<T>): Promise<T> {
  const end = Date.now() + ms;
  for (let attempt = 0; ; attempt++) {
    try {
      return await f();
    } catch (e) {
      const pause = Math.min(100 * 2 ** attempt, 500);
      if (!retryable(kind, e) || Date.now() + pause >= end) throw e;
      await sleep(pause);
    }
  }
}
