/**
 * The daemon process's answer to a failure no code path handled (docs/operations.md, "Process-
 * level failure policy"). Each is a bug, logged with its stack and counted:
 *
 * - a promise rejection nobody awaited: the failed operation is already over, and everything
 *   else is intact; the daemon serves on (killing it would end every other caller's work);
 * - an exception nothing caught: it unwound a stack at an unknown point, so the daemon's state
 *   may be inconsistent; the daemon exits with EXIT_UNCAUGHT for its supervisor to restart it
 *   (recovery re-adopts the running sandboxes).
 */
import type { Logger } from "../util/index.js";

/** EX_SOFTWARE (sysexits.h): an internal software error. */
export const EXIT_UNCAUGHT = 70;

export type ProcessFailure = "unhandled_rejection" | "uncaught_exception";

export interface FailurePolicyOptions {
  log: Logger;
  /** Counts one failure (a metric). */
  count?: (kind: ProcessFailure) => void;
  /** The process whose events are handled (a stand-in in tests). */
  proc?: NodeJS.EventEmitter;
  exit?: (code: number) => void;
}

const describe = (e: unknown): Record<string, unknown> =>
  e instanceof Error ? { error: e.message, stack: e.stack } : { error: String(e) };

/** Installs the policy; returns what removes it. */
export function installFailurePolicy(o: FailurePolicyOptions): () => void {
  const proc = o.proc ?? process;
  const exit = o.exit ?? ((code: number) => process.exit(code));
  const onRejection = (reason: unknown) => {
    o.count?.("unhandled_rejection");
    o.log.warn("unhandled promise rejection (a bug); the daemon keeps serving", describe(reason));
  };
  const onException = (e: unknown) => {
    o.count?.("uncaught_exception");
    o.log.warn("uncaught exception (a bug); exiting, state may be inconsistent", describe(e));
    exit(EXIT_UNCAUGHT);
  };
  proc.on("unhandledRejection", onRejection);
  proc.on("uncaughtException", onException);
  return () => {
    proc.off("unhandledRejection", onRejection);
    proc.off("uncaughtException", onException);
  };
}
