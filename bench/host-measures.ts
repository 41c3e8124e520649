/**
 * What a benchmark reads from the host rather than the API: a process's PSS, the host's
 * MemAvailable, the VMM processes running on a data dir, and the disk blocks a tree of files
 * takes (du-style: each inode once).
 */
import { lstat, readdir, readFile, readlink } from "node:fs/promises";
import { basename, join } from "node:path";
import { pidsReferencing } from "../src/util/proc.js";

export async function memAvailableKiB(): Promise<number> {
  const m = /MemAvailable:\s+(\d+)/.exec(await readFile("/proc/meminfo", "utf8"));
  return Number(m?.[1] ?? 0);
}

/** The proportional set size of a process (0 if it is gone). */
export async function pssKiB(pid: number): Promise<number> {
  const text = await readFile(`/proc/${pid}/smaps_rollup`, "utf8").catch(() => "");
  return Number(/^Pss:\s+(\d+)/m.exec(text)?.[1] ?? 0);
}

/** Pids of the QEMU processes whose command line mentions `dataDir` (a daemon's VMMs). */
export async function vmmPids(dataDir: string): Promise<number[]> {
  const out: number[] = [];
  for (const pid of await pidsReferencing(dataDir)) {
    const exe = await readlink(`/proc/${pid}/exe`).catch(() => "");
    if (basename(exe).startsWith("qemu-system")) out.push(pid);
  }
  return out;
}

/**
 * Bytes of disk the files under `paths` take (st_blocks × 512), each inode counted once across
 * all of them, as `du` does: hard links to the same file add nothing.
 */
export async function diskUsageBytes(paths: readonly string[]): Promise<number> {
  const seen = new Set<string>();
  let total = 0;
  const walk = async (p: string): Promise<void> => {
    const st = await lstat(p).catch(() => null);
    if (!st) return; // gone meanwhile
    const key = `${st.dev}:${st.ino}`;
    if (seen.has(key)) return;
    seen.add(key);
    total += st.blocks * 512;
    if (st.isDirectory()) {
      const names = await readdir(p).catch(() => [] as string[]);
      for (const n of names) await walk(join(p, n));
    }
  };
  for (const p of paths) await walk(p);
  return total;
}
