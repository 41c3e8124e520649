/** What this host offers a cluster's placement: its cores, its memory, the memory free now. */
import { readFile } from "node:fs/promises";
import { availableParallelism, freemem, totalmem } from "node:os";

export const hostCores = (): number => availableParallelism();

export const hostMemoryMiB = (): number => Math.floor(totalmem() / (1 << 20));

/** MemAvailable (what the kernel could give without swapping), else free memory. */
export async function freeMemoryMiB(): Promise<number> {
  const text = await readFile("/proc/meminfo", "utf8").catch(() => "");
  const m = /^MemAvailable:\s+(\d+) kB$/m.exec(text);
  return m ? Math.floor(Number(m[1]) / 1024) : Math.floor(freemem() / (1 << 20));
}
