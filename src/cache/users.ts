/**
 * The data directories that use a cache: each daemon records its own in `<cache>/users/` when it
 * starts (one file per data directory, written atomically), so a collector run from anywhere
 * finds every snapshot that names a cache entry. A record is stale when its data directory is
 * gone (a test's mkdtemp directory, removed); the collector then drops it.
 */
import { createHash } from "node:crypto";
import { mkdir, readdir, readFile, rm } from "node:fs/promises";
import { join, resolve } from "node:path";
import { z } from "zod";
import { writeJsonAtomic } from "../util/index.js";
import { exists } from "../util/index.js";

const UserSchema = z.object({
  format: z.literal("forkd-cache-user/1"),
  dataDir: z.string().min(1).max(4096),
  since: z.string().max(64),
});

export const usersDir = (cacheDir: string): string => join(cacheDir, "users");
const userFile = (cacheDir: string, dataDir: string): string =>
  join(
    usersDir(cacheDir),
    `${createHash("sha256").update(resolve(dataDir)).digest("hex").slice(0, 32)}.json`,
  );

/** Records that `dataDir` uses the cache (idempotent). */
export async function registerUser(cacheDir: string, dataDir: string): Promise<void> {
  await mkdir(usersDir(cacheDir), { recursive: true, mode: 0o700 });
  const file = userFile(cacheDir, dataDir);
  if (await exists(file)) return;
  await writeJsonAtomic(
    file,
    { format: "forkd-cache-user/1", dataDir: resolve(dataDir), since: new Date().toISOString() },
    0o600,
  );
}

export interface Users {
  /** Data directories that exist (with the record file; null: not recorded, added by the caller). */
  live: Array<{ dataDir: string; file: string | null }>;
  /** Records of data directories that are gone (or unreadable records). */
  stale: Array<{ dataDir: string | null; file: string }>;
}

/** The recorded users, plus `extra` data directories (the collector's own), each once. */
export async function readUsers(cacheDir: string, extra: string[] = []): Promise<Users> {
  const out: Users = { live: [], stale: [] };
  const seen = new Set<string>();
  const dir = usersDir(cacheDir);
  for (const name of (await readdir(dir).catch(() => [] as string[])).sort()) {
    if (!name.endsWith(".json") || name.startsWith(".")) continue;
    const file = join(dir, name);
    const u = await readFile(file, "utf8")
      .then((raw) => UserSchema.safeParse(JSON.parse(raw)))
      .catch(() => null);
    if (!u?.success) {
      out.stale.push({ dataDir: null, file });
      continue;
    }
    if (seen.has(u.data.dataDir)) continue;
    seen.add(u.data.dataDir);
    if (await exists(u.data.dataDir)) out.live.push({ dataDir: u.data.dataDir, file });
    else out.stale.push({ dataDir: u.data.dataDir, file });
  }
  for (const d of extra.map((x) => resolve(x))) {
    if (seen.has(d)) continue;
    seen.add(d);
    if (await exists(d)) out.live.push({ dataDir: d, file: null });
  }
  return out;
}

export const dropUser = (file: string): Promise<void> => rm(file, { force: true });
