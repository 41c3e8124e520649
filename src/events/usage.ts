/**
 * Running sandboxes' host usage for GET /v1/events' `usage` event, read as the sandbox metrics
 * route reads it (src/metrics/sandbox-usage.ts): CPU from the VMM's /proc/<pid>/stat, here as
 * the share of its vCPUs used since the previous sample (the first sample: since the VMM
 * started), and memory as the private pages of /proc/<pid>/smaps_rollup. One sampler per
 * stream, holding only the previous reading of each VMM.
 */
import { readFile } from "node:fs/promises";
import { readSmapsRollup } from "../metrics/index.js";
import { parseProcStat } from "../metrics/index.js";

export interface UsageTarget {
  id: string;
  pid: number;
  vcpus: number;
}

export interface Usage {
  cpu_percent: number;
  memory_bytes: number;
}

export class UsageSampler {
  private previous = new Map<number, { busyS: number; atS: number }>();

  async sample(targets: UsageTarget[]): Promise<Record<string, Usage>> {
    const out: Record<string, Usage> = {};
    const next = new Map<number, { busyS: number; atS: number }>();
    const uptime = await readFile("/proc/uptime", "utf8").then(
      (t) => Number(t.split(" ")[0]),
      () => NaN,
    );
    for (const t of targets) {
      const st = await readFile(`/proc/${t.pid}/stat`, "utf8").then(parseProcStat, () => null);
      const rollup = await readSmapsRollup(t.pid);
      let cpu = 0;
      if (st && Number.isFinite(uptime)) {
        const before = this.previous.get(t.pid) ?? { busyS: 0, atS: st.startS };
        const wall = uptime - before.atS;
        if (wall > 0) cpu = (100 * Math.max(0, st.busyS - before.busyS)) / wall / Math.max(1, t.vcpus);
        next.set(t.pid, { busyS: st.busyS, atS: uptime });
      }
      out[t.id] = {
        cpu_percent: Math.round(Math.min(100, cpu) * 100) / 100,
        memory_bytes: rollup?.private ?? 0,
      };
    }
    this.previous = next;
    return out;
  }
}
