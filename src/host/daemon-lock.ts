/**
 * One daemon per data directory. The lock is a listening socket in Linux's abstract namespace,
 * named after the data directory: binding it is exclusive, and the kernel releases it when the
 * process dies (also on kill -9), so there is no stale lock file to judge or race over.
 */
import { createHash } from "node:crypto";
import { connect, createServer } from "node:net";
import type { Server } from "node:net";
import { ForkdError } from "../util/index.js";

export const lockName = (dataDir: string): string =>
  `\0forkd-daemon-${createHash("sha256").update(dataDir).digest("hex").slice(0, 24)}`;

/** Takes the lock or throws `conflict`; the returned function releases it. */
export function acquireDaemonLock(dataDir: string): Promise<() => Promise<void>> {
  return new Promise((resolve, reject) => {
    const server: Server = createServer((sock) => sock.destroy());
    server.once("error", (e: NodeJS.ErrnoException) => {
      if (e.code === "EADDRINUSE") {
        reject(
          new ForkdError("conflict", `another forkd daemon already owns ${dataDir}`, { data_dir: dataDir }),
        );
      } else reject(e);
    });
    server.listen(lockName(dataDir), () => {
      server.unref();
      resolve(() => new Promise<void>((r) => server.close(() => r())));
    });
  });
}

/** Whether some process holds the lock (a daemon is running, perhaps still starting or busy). */
export function daemonHoldsLock(dataDir: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(lockName(dataDir));
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}
