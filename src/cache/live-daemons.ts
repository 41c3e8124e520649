/**
 * Data directories of the forkd daemons running now whatever their version (one that predates
 * the users/ records never wrote one): a process whose environment names a FORKD_DATA_DIR and
 * whose cache (its FORKD_CACHE_DIR, or the default) is this one. Read from /proc/PID/environ
 * (root reads every process's); a process that cannot be read is skipped.
 */
import { readdir, readFile } from "node:fs/promises";
import { resolve } from "node:path";
import { defaultPaths } from "../host/index.js";

/** Bound on one environ read (it is the process's whole environment block). */
const MAX_ENVIRON = 1 << 20;

export async function liveDaemonDataDirs(cacheDir: string): Promise<string[]> {
  const out = new Set<string>();
  const want = resolve(cacheDir);
  for (const p of await readdir("/proc").catch(() => [] as string[])) {
    if (!/^\d+$/.test(p)) continue;
    const raw = await readFile(`/proc/${p}/environ`).catch(() => null);
    if (!raw || raw.length > MAX_ENVIRON || !raw.includes("FORKD_")) continue;
    const env: NodeJS.ProcessEnv = {};
    for (const kv of raw.toString("utf8").split("\0")) {
      const i = kv.indexOf("=");
      if (i > 0 && kv.startsWith("FORKD_")) env[kv.slice(0, i)] = kv.slice(i + 1);
    }
    if (!env.FORKD_DATA_DIR) continue;
    const paths = defaultPaths(env);
    if (paths.cacheDir === want) out.add(paths.dataDir);
  }
  return [...out].sort();
}
