/**
 * Which data directory each network instance on this host belongs to, so the instances of a
 * daemon that died with its data directory (removed meanwhile) are not left in the kernel for
 * ever: no later daemon derives their id (./slots.ts) from a directory of its own.
 *
 * Before an instance makes anything in the kernel, its daemon writes the marker
 * /run/forkd/net/<id> (JSON: the data directory); removing the instance removes the marker.
 * /run is emptied at boot, as the kernel state is. At start, a daemon removes every instance
 * whose marker names a data directory that no longer exists and that no daemon holds (its
 * lock, ../host/daemon-lock.ts). Instances without a marker (an older daemon's) are never touched.
 */
import { mkdir, readdir, readFile, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { z } from "zod";
import { daemonHoldsLock } from "../host/index.js";
import { writeJsonAtomic } from "../util/index.js";

export const OWNERS_DIR = "/run/forkd/net";

const ID_RE = /^[0-9a-f]{4}$/;
const Marker = z.object({ data_dir: z.string().min(1) });

/** Records that instance `id` belongs to `dataDir`. */
export async function recordOwner(id: string, dataDir: string, dir = OWNERS_DIR): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o755 });
  await writeJsonAtomic(join(dir, id), { data_dir: dataDir }, 0o644);
}

export async function forgetOwner(id: string, dir = OWNERS_DIR): Promise<void> {
  await rm(join(dir, id), { force: true });
}

/**
 * Instances (other than `ownId`) whose data directory is gone and held by no daemon. A marker
 * that cannot be read is skipped (it is not known whose it is).
 */
export async function orphanInstances(
  ownId: string,
  dir = OWNERS_DIR,
): Promise<Array<{ id: string; dataDir: string }>> {
  const out: Array<{ id: string; dataDir: string }> = [];
  for (const id of (await readdir(dir).catch(() => [] as string[])).sort()) {
    if (!ID_RE.test(id) || id === ownId) continue;
    let dataDir: string;
    try {
      dataDir = Marker.parse(JSON.parse(await readFile(join(dir, id), "utf8"))).data_dir;
    } catch {
      continue;
    }
    if (!(await gone(dataDir)) || (await daemonHoldsLock(dataDir))) continue;
    out.push({ id, dataDir });
  }
  return out;
}

/** Whether nothing is at `p` (an unreadable path is not gone). */
const gone = (p: string): Promise<boolean> =>
  stat(p).then(
    () => false,
    (e: NodeJS.ErrnoException) => e.code === "ENOENT",
  );
