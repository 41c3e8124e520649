/**
 * A process that runs until SIGTERM or SIGINT (the daemon, a gateway): the signal closes it and
 * the process exits 0, or 1 when closing failed; SIGHUP calls `reload`.
 */
import { errorMessage } from "../util/index.js";
import type { Logger } from "../util/index.js";

export function runUntilSignal(
  log: Logger,
  running: { close(): Promise<void>; reloadTokens(): Promise<void> },
): void {
  const stop = () => {
    running.close().then(
      () => process.exit(0),
      (e: unknown) => {
        log.warn("stopping failed", { error: errorMessage(e) });
        process.exit(1);
      },
    );
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  process.on("SIGHUP", () => void running.reloadTokens());
}
