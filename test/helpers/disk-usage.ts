/** How much disk a call makes some directories use at its peak (du, polled while it runs). */
import { execFile } from "node:child_process";
import { promisify } from "node:util";

const sh = promisify(execFile);

/** KiB allocated under `dirs` (holes do not count). */
export async function usedKiB(dirs: string[]): Promise<number> {
  const { stdout } = await sh("du", ["-sk", "-c", ...dirs]);
  return Number(/(\d+)\s+total/.exec(stdout)?.[1] ?? "NaN");
}

/** Runs `fn`, polling `dirs` every 100 ms: its result (or error) and the peak growth in KiB. */
export async function peakGrowth<T>(
  dirs: string[],
  fn: () => Promise<T>,
): Promise<{ result: PromiseSettledResult<T>; grownKiB: number }> {
  const start = await usedKiB(dirs);
  let peak = start;
  let polling = true;
  const poll = (async () => {
    while (polling) {
      peak = Math.max(peak, await usedKiB(dirs).catch(() => peak));
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  const [result] = await Promise.allSettled([fn()]);
  polling = false;
  await poll;
  peak = Math.max(peak, await usedKiB(dirs));
  return { result: result as PromiseSettledResult<T>, grownKiB: peak - start };
}
