/**
 * A sandbox's host-side usage in E2B's metrics shape: CPU from its VMM's /proc/<pid>/stat (busy
 * time since the VMM started, as a share of its vCPUs), memory it holds on its own (smaps_rollup
 * private pages), and what its disk layers in its own directory take. One sample: now.
 */
import { readFile, readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import { readSmapsRollup } from "./memory.js";

export interface UsageSample {
  timestamp: string;
  cpu_used_pct: number;
  cpu_count: number;
  mem_used: number;
  mem_total: number;
  disk_used: number;
  disk_total: number;
}

export interface UsageTarget {
  pid: number | null;
  dir: string;
  vcpus: number;
  memoryMiB: number;
  diskMiB: number | null;
}

/** Clock ticks per second of /proc's times (USER_HZ: 100 on every Linux platform we run on). */
const HZ = 100;

/** utime + stime (s) and the start time (s since boot) from /proc/<pid>/stat's text. */
export function parseProcStat(text: string): { busyS: number; startS: number } | null {
  const close = text.lastIndexOf(")");
  if (close < 0) return null;
  const f = text.slice(close + 2).split(" "); // f[0] is field 3 (state)
  const utime = Number(f[11]);
  const stime = Number(f[12]);
  const start = Number(f[19]);
  if (![utime, stime, start].every(Number.isFinite)) return null;
  return { busyS: (utime + stime) / HZ, startS: start / HZ };
}

async function cpuPct(pid: number, vcpus: number): Promise<number> {
  try {
    const st = parseProcStat(await readFile(`/proc/${pid}/stat`, "utf8"));
    const uptime = Number((await readFile("/proc/uptime", "utf8")).split(" ")[0]);
    if (!st || !Number.isFinite(uptime) || uptime <= st.startS) return 0;
    return Math.min(100, (100 * st.busyS) / (uptime - st.startS) / Math.max(1, vcpus));
  } catch {
    return 0; // the VMM is gone (or paused): no CPU
  }
}

async function diskBytes(dir: string): Promise<number> {
  let total = 0;
  try {
    for (const name of await readdir(dir)) {
      if (!/\.(qcow2|img|raw)$/.test(name)) continue;
      total += (await stat(join(dir, name))).blocks * 512;
    }
  } catch {
    /* its directory went away with it */
  }
  return total;
}

export async function sampleUsage(t: UsageTarget, now = new Date()): Promise<UsageSample> {
  const rollup = t.pid ? await readSmapsRollup(t.pid) : null;
  return {
    timestamp: now.toISOString(),
    cpu_used_pct: t.pid ? Math.round((await cpuPct(t.pid, t.vcpus)) * 100) / 100 : 0,
    cpu_count: t.vcpus,
    mem_used: rollup?.private ?? 0,
    mem_total: t.memoryMiB * 1024 * 1024,
    disk_used: await diskBytes(t.dir),
    disk_total: (t.diskMiB ?? 0) * 1024 * 1024,
  };
}
