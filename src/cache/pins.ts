/**
 * Pins: a process's use of a cache entry while it is in progress (a snapshot being made from an
 * image, a Dockerfile build on its cached layers, an unpack registering its image), before any
 * snapshot metadata names it. One file per pin in `<cache>/pins/`, naming the process (pid and
 * start time: a pid is reused) and the entry; a pin of a process that no longer runs is stale.
 *
 * Pinning and collecting exclude each other through `<cache>/.gc.lock`: a pin is written under
 * the shared lock after checking that its entry is still there, and the collector decides and
 * deletes under the exclusive one. So either the pin was written first (the collector reads it
 * and keeps the entry) or the collector ran first (the pin finds the entry gone and says so:
 * the caller builds or pulls it again). A pin also touches its entry (its last use).
 */
import { randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rm, utimes } from "node:fs/promises";
import { join } from "node:path";
import { z } from "zod";
import { writeJsonAtomic } from "../util/index.js";
import { exists } from "../util/index.js";
import { processStartTime } from "../util/index.js";
import { entryIdOf } from "./entries.js";
import { takeFlock } from "./flock.js";

export const GC_LOCK = ".gc.lock";
/** How long a pin waits for a running collection (it deletes, then lets go). */
const PIN_WAIT_MS = 120_000;

const PinSchema = z.object({
  format: z.literal("forkd-cache-pin/1"),
  entry: z.string().max(512),
  pid: z.number().int().positive(),
  start: z.number().int().nonnegative(),
  dataDir: z.string().max(4096),
  since: z.string().max(64),
});
export type Pin = z.infer<typeof PinSchema> & { file: string };

export const pinsDir = (cacheDir: string): string => join(cacheDir, "pins");

/** The pins there are: live (their process runs) and stale (it does not, or unreadable). */
export async function readPins(cacheDir: string): Promise<{ live: Pin[]; stale: string[] }> {
  const live: Pin[] = [];
  const stale: string[] = [];
  const dir = pinsDir(cacheDir);
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    if (!name.endsWith(".json") || name.startsWith(".")) continue;
    const file = join(dir, name);
    const p = await readFile(file, "utf8")
      .then((raw) => PinSchema.safeParse(JSON.parse(raw)))
      .catch(() => null);
    if (!p?.success) {
      stale.push(file);
      continue;
    }
    if ((await processStartTime(p.data.pid)) === p.data.start) live.push({ ...p.data, file });
    else stale.push(file);
  }
  return { live, stale };
}

/** Pins held by one owner (an operation): released together. */
export class PinScope {
  private readonly files: string[] = [];
  constructor(private readonly pins: CachePins) {}

  /**
   * Pins the entry holding `path` (a path in the cache) until release(); false when the entry is
   * gone (collected): the caller makes it again. A path outside every entry needs no pin: true.
   */
  async pin(path: string): Promise<boolean> {
    const file = await this.pins.write(path);
    if (file === false) return false;
    if (file) this.files.push(file);
    return true;
  }

  async release(): Promise<void> {
    const files = this.files.splice(0);
    await Promise.all(files.map((f) => rm(f, { force: true })));
  }
}

export class CachePins {
  constructor(
    readonly cacheDir: string,
    /** The data directory of the process pinning (reports only). */
    readonly dataDir: string,
  ) {}

  scope(): PinScope {
    return new PinScope(this);
  }

  /** Writes a pin of the entry holding `path`: its file, null (no entry), false (gone). */
  async write(path: string): Promise<string | null | false> {
    const id = entryIdOf(this.cacheDir, path);
    if (!id) return null;
    const entry = join(this.cacheDir, id);
    const start = await processStartTime(process.pid);
    if (start === null) throw new Error("cannot read this process's start time");
    await mkdir(pinsDir(this.cacheDir), { recursive: true, mode: 0o700 });
    const lock = await takeFlock(join(this.cacheDir, GC_LOCK), { shared: true, waitMs: PIN_WAIT_MS });
    if (!lock)
      throw new Error(`the cache ${this.cacheDir} is being collected for longer than ${PIN_WAIT_MS} ms`);
    try {
      if (!(await exists(entry))) return false;
      const file = join(pinsDir(this.cacheDir), `${process.pid}-${randomBytes(8).toString("hex")}.json`);
      await writeJsonAtomic(
        file,
        {
          format: "forkd-cache-pin/1",
          entry: id,
          pid: process.pid,
          start,
          dataDir: this.dataDir,
          since: new Date().toISOString(),
        },
        0o600,
      );
      const now = new Date();
      await utimes(entry, now, now).catch(() => undefined);
      return file;
    } finally {
      await lock.release();
    }
  }
}
