/** Where forkd keeps things. One config object, built once by the entry point and injected. */
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export interface Paths {
  /** Snapshots, sandboxes and daemon state (survives reboots). */
  dataDir: string;
  /** Built guest images, keyed by content hash (rebuildable). */
  cacheDir: string;
  /** The daemon's API socket. */
  socket: string;
  /** The repository root (guest/ sources, build scripts). */
  repoDir: string;
}

export const REPO_DIR = resolve(fileURLToPath(import.meta.url), "../../../..");

export function defaultPaths(env: NodeJS.ProcessEnv = process.env): Paths {
  const dataDir = resolve(env.FORKD_DATA_DIR ?? "/var/lib/forkd");
  return {
    dataDir,
    cacheDir: resolve(env.FORKD_CACHE_DIR ?? "/var/cache/forkd"),
    socket: resolve(env.FORKD_SOCKET ?? join(dataDir, "forkd.sock")),
    repoDir: REPO_DIR,
  };
}

export const snapshotsDir = (p: Paths): string => join(p.dataDir, "snapshots");
export const sandboxesDir = (p: Paths): string => join(p.dataDir, "sandboxes");
