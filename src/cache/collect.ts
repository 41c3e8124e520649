/**
 * One collection of a cache directory: under build.sh's lock (`<cache>/.lock`: no image build
 * runs, and none starts until it is done) and the pins' lock held exclusive (`.gc.lock`: no pin
 * is being written), it reads what keeps each entry (references.ts), plans (plan.ts) and, unless
 * a dry run, deletes: each entry renamed into `<cache>/.gc-trash-*` first (it disappears at once
 * and whole), then removed. Stale pins and records of data directories that are gone are dropped.
 * A trash directory a killed collection left is removed by the next one.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readdir, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { listEntries } from "./entries.js";
import { liveDaemonDataDirs } from "./live-daemons.js";
import { takeFlock } from "./flock.js";
import { planCollection } from "./plan.js";
import type { Plan } from "./plan.js";
import { GC_LOCK, readPins } from "./pins.js";
import { backingEdges, openReferences, pinReferences, snapshotReferences } from "./references.js";
import type { Reason } from "./references.js";
import { dropUser, readUsers } from "./users.js";

/** build.sh's lock (guest/image/build.sh: one builder per cache). */
export const BUILD_LOCK = ".lock";
/** Default grace: an entry used within the last 30 minutes stays. */
export const DEFAULT_GRACE_MS = 30 * 60_000;

export interface CollectOptions {
  dryRun: boolean;
  /** null: evict every entry nothing keeps. */
  budgetBytes: number | null;
  graceMs?: number;
  /** Data directories to count as users besides the recorded ones (the caller's own). */
  dataDirs?: string[];
  /** How long to wait for a running image build (build.sh's lock); 0: not at all. */
  waitMs?: number;
  now?: () => number;
}

export interface CollectResult extends Plan {
  cacheDir: string;
  dryRun: boolean;
  budgetBytes: number | null;
  /** Bytes the deletions freed (dry run: would free). */
  freedBytes: number;
  /** Data directories whose snapshots were read. */
  users: string[];
  /** Records of data directories that are gone (dropped unless a dry run). */
  staleUsers: string[];
  stalePins: number;
  /** Set when the collection did not run: a build held the cache's lock past the wait. */
  busy?: string;
}

/** What keeps entries, and the plan, without taking any lock (collect() and `cache ls`). */
export async function survey(
  cacheDir: string,
  o: Pick<CollectOptions, "budgetBytes" | "graceMs" | "dataDirs" | "now">,
): Promise<{ plan: Plan; users: Awaited<ReturnType<typeof readUsers>>; stalePins: string[] }> {
  // Recorded users, the caller's own, and those of daemons running now (an older forkd's too).
  const users = await readUsers(cacheDir, [...(o.dataDirs ?? []), ...(await liveDaemonDataDirs(cacheDir))]);
  const pins = await readPins(cacheDir);
  const entries = await listEntries(cacheDir);
  const references: Array<[string, Reason]> = [];
  for (const u of users.live) references.push(...(await snapshotReferences(cacheDir, u.dataDir)));
  references.push(...pinReferences(pins.live));
  references.push(...(await openReferences(cacheDir)));
  const plan = planCollection({
    entries,
    references,
    deps: await backingEdges(cacheDir, entries),
    graceMs: o.graceMs ?? DEFAULT_GRACE_MS,
    budgetBytes: o.budgetBytes,
    now: (o.now ?? Date.now)(),
  });
  return { plan, users, stalePins: pins.stale };
}

/**
 * Collects `cacheDir` (see the header). A dry run takes no lock (it blocks no build and deletes
 * nothing): it says what a collection run now would delete.
 */
export async function collect(cacheDir: string, o: CollectOptions): Promise<CollectResult> {
  const base = { cacheDir, dryRun: o.dryRun, budgetBytes: o.budgetBytes };
  if (o.dryRun) return result(base, await survey(cacheDir, o));
  await mkdir(cacheDir, { recursive: true });
  const build = await takeFlock(join(cacheDir, BUILD_LOCK), { shared: false, waitMs: o.waitMs ?? 0 });
  if (!build) {
    return {
      ...base,
      totalBytes: 0,
      afterBytes: 0,
      kept: [],
      evict: [],
      freedBytes: 0,
      users: [],
      staleUsers: [],
      stalePins: 0,
      busy: "an image build holds the cache's lock",
    };
  }
  try {
    const pinLock = await takeFlock(join(cacheDir, GC_LOCK), { shared: false, waitMs: 60_000 });
    if (!pinLock) throw new Error(`pins of ${cacheDir} kept its ${GC_LOCK} for a minute`);
    try {
      const s = await survey(cacheDir, o);
      const { plan, users, stalePins } = s;
      {
        for (const name of await readdir(cacheDir)) {
          if (name.startsWith(".gc-trash-")) await rm(join(cacheDir, name), { recursive: true, force: true });
        }
        if (plan.evict.length > 0) {
          const trash = join(cacheDir, `.gc-trash-${randomBytes(6).toString("hex")}`);
          await mkdir(trash, { mode: 0o700 });
          for (const [i, e] of plan.evict.entries()) {
            await rename(join(cacheDir, e.id), join(trash, String(i))).catch((err: NodeJS.ErrnoException) => {
              if (err.code !== "ENOENT") throw err;
            });
          }
          await rm(trash, { recursive: true, force: true });
        }
        for (const u of users.stale) if (u.dataDir !== null) await dropUser(u.file);
        for (const p of stalePins) await rm(p, { force: true });
      }
      return result(base, s);
    } finally {
      await pinLock.release();
    }
  } finally {
    await build.release();
  }
}

function result(
  base: Pick<CollectResult, "cacheDir" | "dryRun" | "budgetBytes">,
  s: Awaited<ReturnType<typeof survey>>,
): CollectResult {
  return {
    ...base,
    ...s.plan,
    freedBytes: s.plan.totalBytes - s.plan.afterBytes,
    users: s.users.live.map((u) => u.dataDir),
    staleUsers: s.users.stale.map((u) => u.dataDir ?? u.file),
    stalePins: s.stalePins.length,
  };
}
