/**
 * Host memory saved by sharing: children map their snapshot's memory file MAP_PRIVATE, so every
 * page a child has not written is one page-cache page shared by all of them.
 *
 * From each running VMM's /proc/<pid>/smaps_rollup: Rss counts a shared page in full in every
 * process that maps it, Pss divides it among them. Over the VMMs,
 *   saved = Σ Rss − Σ Pss
 * is what their resident memory would take beyond what it takes now if nothing were shared
 * (pages shared with processes other than VMMs, such as libc, count as a sliver). Private is
 * Σ (Private_Clean + Private_Dirty): what the children cost on their own.
 */
import { readFile } from "node:fs/promises";

export interface SmapsRollup {
  rss: number;
  pss: number;
  private: number;
}

export interface SharingSample {
  processes: number;
  rssBytes: number;
  pssBytes: number;
  privateBytes: number;
  savedBytes: number;
}

/** Parses the text of /proc/<pid>/smaps_rollup (values in kB) into bytes. */
export function parseSmapsRollup(text: string): SmapsRollup {
  const kb = (field: string): number => {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB$`, "m").exec(text);
    return m?.[1] ? Number(m[1]) * 1024 : 0;
  };
  return { rss: kb("Rss"), pss: kb("Pss"), private: kb("Private_Clean") + kb("Private_Dirty") };
}

export async function readSmapsRollup(pid: number): Promise<SmapsRollup | null> {
  try {
    return parseSmapsRollup(await readFile(`/proc/${pid}/smaps_rollup`, "utf8"));
  } catch {
    return null; // exited meanwhile, or not ours to read
  }
}

export function sumSharing(rollups: SmapsRollup[]): SharingSample {
  let rss = 0;
  let pss = 0;
  let priv = 0;
  for (const r of rollups) {
    rss += r.rss;
    pss += r.pss;
    priv += r.private;
  }
  return {
    processes: rollups.length,
    rssBytes: rss,
    pssBytes: pss,
    privateBytes: priv,
    savedBytes: Math.max(0, rss - pss),
  };
}

/**
 * Samples the VMMs' memory at most once per `ttlMs` while the set of VMMs stays the same:
 * reading smaps_rollup walks each process's page tables, which is not free with hundreds of
 * children. A VMM started or gone is seen at the next scrape.
 */
export class SharingProbe {
  private last: { at: number; key: string; sample: Promise<SharingSample> } | null = null;

  constructor(
    private readonly pids: () => number[],
    private readonly ttlMs = 10_000,
  ) {}

  sample(): Promise<SharingSample> {
    const now = Date.now();
    const pids = this.pids();
    const key = [...pids].sort((a, b) => a - b).join(",");
    if (this.last && this.last.key === key && now - this.last.at < this.ttlMs) return this.last.sample;
    const sample = (async () => {
      const out: SmapsRollup[] = [];
      for (const pid of pids) {
        const r = await readSmapsRollup(pid);
        if (r) out.push(r);
      }
      return sumSharing(out);
    })();
    this.last = { at: now, key, sample };
    return sample;
  }
}
