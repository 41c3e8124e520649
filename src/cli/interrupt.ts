/**
 * Ctrl-C (SIGINT) or a hang-up (SIGHUP) during a long call cuts its request: the daemon sees
 * the client go (an exec's command is killed; a snapshot, push or pull goes on to its end, see
 * docs/api.md) and the CLI exits 128 + the signal's number (130, 129). A second signal kills
 * the CLI at once (Node's default, the handler being gone).
 */
import { constants } from "node:os";

/** Thrown by interruptible() when a signal cut the call; main() exits with `exitCode`. */
export class Interrupted extends Error {
  constructor(
    readonly signal: "SIGINT" | "SIGHUP",
    readonly what: string,
  ) {
    super(`interrupted; ${what}`);
    this.name = "Interrupted";
  }
  get exitCode(): number {
    return 128 + constants.signals[this.signal];
  }
}

/**
 * Runs `call` with a signal that a SIGINT or SIGHUP aborts; then throws Interrupted, saying
 * `what` became of the work.
 */
export async function interruptible<T>(what: string, call: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const ctl = new AbortController();
  let got: "SIGINT" | "SIGHUP" | null = null;
  const on = (sig: "SIGINT" | "SIGHUP") => () => {
    got = sig;
    ctl.abort();
  };
  const onInt = on("SIGINT");
  const onHup = on("SIGHUP");
  process.once("SIGINT", onInt);
  process.once("SIGHUP", onHup);
  try {
    return await call(ctl.signal);
  } catch (e) {
    if (got !== null) throw new Interrupted(got, what);
    throw e;
  } finally {
    process.off("SIGINT", onInt);
    process.off("SIGHUP", onHup);
  }
}

/**
 * `n` signals that `signal` aborts, through one listener on it: for `n` calls at once, each with
 * its own signal, rather than `n` listeners on one (Node warns past 10: MaxListenersExceeded).
 */
export function fanOut(signal: AbortSignal, n: number): AbortSignal[] {
  const ctls = Array.from({ length: n }, () => new AbortController());
  const abort = () => ctls.forEach((c) => c.abort(signal.reason));
  if (signal.aborted) abort();
  else signal.addEventListener("abort", abort, { once: true });
  return ctls.map((c) => c.signal);
}
