/**
 * How a failure ends the CLI: 2 for a usage error or an invalid argument, 3 for something not
 * found, 128 + N for a signal that cut the call, 1 otherwise; the message (and, for a guest that
 * failed to boot, its console's tail) on stderr.
 */
import { ForkdError, InvalidArgumentError } from "@forkd/sdk";
import { Interrupted } from "./interrupt.js";

/** A mistake in the command line, found before any request. */
export function usageError(message: string): ForkdError {
  return new InvalidArgumentError(message, { code: "invalid_argument" });
}

/** The exit code for `e`, having said why on `say`. */
export function reportFailure(e: unknown, say: (line: string) => void): number {
  if (e instanceof Interrupted) {
    say(`forkd: ${e.message}`);
    return e.exitCode;
  }
  if (e instanceof ForkdError) {
    say(`forkd: ${e.message}${e.code ? ` [${e.code}]` : ""}`);
    const tail = e.details.console_tail;
    if (typeof tail === "string") say(`guest console:\n${tail}`);
    return e.code === "invalid_argument" ? 2 : e.code === "not_found" ? 3 : 1;
  }
  say(`forkd: ${e instanceof Error ? e.message : String(e)}`);
  return 1;
}
