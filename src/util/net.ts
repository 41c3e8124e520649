/** Unix-socket dialling with retry: a VMM creates its sockets a few ms after it starts. */
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

/** Connects to `path`, retrying with backoff (1 ms doubling to 20 ms) until `timeoutMs`. */
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
