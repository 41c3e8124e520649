/** Waiting on the outside world: every wait has a deadline and can be cancelled. */
import { ForkdError } from "./errors.js";

export const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason as Error);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason as Error);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });

/** Resolves with `p` or rejects with a `timeout` ForkdError after `ms`. */
export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new ForkdError("timeout", `${what} timed out after ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

export const nowMs = (): number => performance.now();

/** Milliseconds since `start` (from nowMs), rounded to 0.1 ms. */
export const since = (start: number): number => Math.round((performance.now() - start) * 10) / 10;
