/** Unix-socket dialling with retry: a VMM creates its sockets a few ms after it starts. */
import { existsSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { ForkdError, errorMessage } from "./errors.js";
import { sleep } from "./time.js";

function dialOnce(path: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    const onError = (e: Error) => {
      s.destroy();
      reject(e);
    };
    s.once("error", onError);
    s.once("connect", () => {
      s.off("error", onError);
      resolve(s);
    });
  });
}

/**
 * Connects to `path`, retrying with backoff (1 ms doubling to 20 ms) until `timeoutMs`. While the
 * socket does not exist yet, a retry is a stat, not a connect: a failed connect builds a socket,
 * an error with its stack and a teardown in the daemon, and a 100-way fork polls 100 sockets of
 * VMMs that take seconds to start when they all start at once (that was ~15% of the daemon's CPU
 * in a fan-out).
 */
export async function dialUnix(
  path: string,
  timeoutMs: number,
  what: string,
  signal?: AbortSignal,
): Promise<Socket> {
  const deadline = Date.now() + timeoutMs;
  let delay = 1;
  for (;;) {
    try {
      // Synchronous on purpose: one stat system call, no promise or error object when absent.
      if (!existsSync(path)) throw new ForkdError("unavailable", "it does not exist (ENOENT)");
      return await dialOnce(path);
    } catch (e) {
      if (Date.now() + delay > deadline) {
        throw new ForkdError("unavailable", `${what} socket ${path}: ${errorMessage(e)}`, {}, e);
      }
      await sleep(delay, signal);
      delay = Math.min(delay * 2, 20);
    }
  }
}
