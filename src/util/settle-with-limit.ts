/** Running a number of tasks with bounded parallelism (a fork's fan-out). */

/** Runs `n` tasks with at most `limit` in flight; results in task order, like allSettled. */
export async function settleWithLimit<T>(
  n: number,
  limit: number,
  task: () => Promise<T>,
): Promise<PromiseSettledResult<T>[]> {
  const out: PromiseSettledResult<T>[] = new Array<PromiseSettledResult<T>>(n);
  let next = 0;
  const worker = async () => {
    while (next < n) {
      const i = next++;
      try {
        out[i] = { status: "fulfilled", value: await task() };
      } catch (reason) {
        out[i] = { status: "rejected", reason };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, Math.max(1, limit)) }, worker));
  return out;
}
