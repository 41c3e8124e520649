/**
 * Unpack: a pack (tar + zstd) into a staging directory, bounded and verified as it is written,
 * then registered (pack.ts registerStaged).
 *
 * The tar reader (src/archive/tar-reader.ts, its PACK_TAR profile) admits each member before its first byte is written: only
 * plain files and directories at a pack's paths, no path twice, each file exactly the size the
 * pack's manifest states, the whole within the unpack limit (unpack-budget.ts: the configured
 * FORKD_UNPACK_MAX_MIB and the data directory's free space); `zstd -d` keeps its default
 * 128 MiB window bound. Every file is written sparse (all-zero blocks become holes) and hashed
 * as it streams, so registration does not read it again. Anything refused stops the
 * decompressor at once; the staging directory and the archive are removed whatever happens.
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import type { Hash } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdir, open, rm, statfs } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import { dirname, join } from "node:path";
import { pipeline } from "node:stream/promises";
import { Transform } from "node:stream";
import type { Readable } from "node:stream";
import { setImmediate as yieldNow } from "node:timers/promises";
import { ForkdError } from "../util/index.js";
import { TarReader } from "../archive/index.js";
import type { TarEntry, TarSink } from "../archive/index.js";
import { PACK_TAR } from "../archive/index.js";
import { staysInside } from "../archive/index.js";
import { UnpackBudget, unpackLimit } from "./unpack-budget.js";
import type { BudgetLimit } from "./unpack-budget.js";
import {
  MAX_ENTRIES,
  isPackPath,
  maxPackFileSize,
  mapPackError,
  parsePackManifest,
  stagingName,
} from "./pack.js";
import { registerStaged } from "./register.js";
import type { PackManifest, Registered, UnpackDeps } from "./pack.js";
import { childEnv } from "../util/index.js";
import type { Progress } from "../util/index.js";

/** Space left free on the data directory's filesystem after an unpack or a pull. */
export const FREE_MARGIN = 1 << 30;
const PIECE = 64 << 10;
/** Decompressed bytes after the end-of-archive marker that are read and dropped (tar pads to 10 KiB). */
const MAX_TRAILING = 1 << 20;
const ZERO = Buffer.alloc(1 << 20);
/** One pass over an archive (up to 64 GiB compressed) takes at most this long. */
const READ_TIMEOUT_MS = 3_600_000;

/** The bound of an unpack or a pull into `deps.store`: the configured limit and free space. */
export async function limitFor(deps: UnpackDeps): Promise<BudgetLimit> {
  const st = await statfs(deps.store.root).catch(() => null);
  return unpackLimit(deps.maxBytes ?? null, st ? st.bavail * st.bsize : null, FREE_MARGIN);
}

/** Feeds `n` zero bytes to `h` (a sparse file's holes), yielding now and then. */
async function hashZeros(h: Hash, n: number): Promise<void> {
  for (let left = n, i = 0; left > 0; i++) {
    const k = Math.min(left, ZERO.length);
    h.update(ZERO.subarray(0, k));
    left -= k;
    if (i % 64 === 63) await yieldNow();
  }
}

const isZero = (b: Buffer): boolean => b.equals(ZERO.subarray(0, b.length));

interface Current {
  path: string;
  fh: FileHandle;
  size: number;
  hash: Hash;
  hashed: number;
}

/** Whether `e` is a file to write (false: a directory); refuses what a pack cannot hold. */
function checkEntry(e: TarEntry): boolean {
  const p = e.path;
  if (p === "" && e.type === "dir") return false;
  if (p === "" || !staysInside(p)) {
    throw new ForkdError("invalid_argument", `pack entry ${JSON.stringify(e.name)} escapes the pack`);
  }
  if (!isPackPath(p, e.type === "dir")) {
    throw new ForkdError("invalid_argument", `unexpected pack entry ${JSON.stringify(e.name)}`);
  }
  return e.type === "file";
}

/** Writes a pack's members into `dir`, within `budget`, hashing each. */
export class PackWriter implements TarSink {
  /** Every file written: path → size and sha256. */
  readonly sums = new Map<string, { size: number; sha256: string }>();
  private cur: Current | null = null;
  private entries = 0;

  constructor(
    private readonly dir: string,
    private readonly budget: UnpackBudget,
  ) {}

  async entry(e: TarEntry): Promise<void> {
    if (++this.entries > MAX_ENTRIES) throw new ForkdError("invalid_argument", "pack has too many entries");
    if (!checkEntry(e)) return;
    const p = e.path;
    this.budget.admit(p, e.size);
    const path = join(this.dir, p);
    await mkdir(dirname(path), { recursive: true, mode: 0o700 });
    const fh = await open(path, "wx", 0o600);
    this.cur = {
      path: p,
      fh,
      size: e.size,
      hash: createHash("sha256"),
      hashed: 0,
    };
  }

  async data(chunk: Buffer, offset: number): Promise<void> {
    const c = this.cur;
    if (!c) throw new ForkdError("internal", "tar data outside a file");
    if (offset > c.hashed) await hashZeros(c.hash, offset - c.hashed);
    c.hash.update(chunk);
    c.hashed = offset + chunk.length;
    for (let at = 0; at < chunk.length; at += PIECE) {
      const piece = chunk.subarray(at, at + PIECE);
      if (!isZero(piece)) await c.fh.write(piece, 0, piece.length, offset + at);
    }
  }

  async end(): Promise<void> {
    const c = this.cur;
    if (!c) throw new ForkdError("internal", "tar end outside a file");
    this.cur = null;
    try {
      if (c.hashed < c.size) await hashZeros(c.hash, c.size - c.hashed);
      await c.fh.truncate(c.size);
      await c.fh.sync();
    } finally {
      await c.fh.close();
    }
    this.sums.set(c.path, { size: c.size, sha256: c.hash.digest("hex") });
  }

  /** Closes a file left open by a failure. */
  async close(): Promise<void> {
    await this.cur?.fh.close().catch(() => undefined);
    this.cur = null;
  }
}

/** Reads manifest.json from a pack's archive, checking every member up to it; writes nothing. */
class ManifestFinder implements TarSink {
  manifest: PackManifest | null = null;
  size = 0;
  private parts: Buffer[] | null = null;
  private entries = 0;

  constructor(private readonly budget: UnpackBudget) {}

  entry(e: TarEntry): Promise<void> {
    if (++this.entries > MAX_ENTRIES) throw new ForkdError("invalid_argument", "pack has too many entries");
    if (!checkEntry(e)) return Promise.resolve();
    this.budget.admit(e.path, e.size);
    if (e.path === "manifest.json") {
      this.parts = [];
      this.size = e.size;
    }
    return Promise.resolve();
  }

  data(chunk: Buffer): Promise<void> {
    this.parts?.push(Buffer.from(chunk));
    return Promise.resolve();
  }

  end(): Promise<void> {
    if (this.parts) {
      this.manifest = parsePackManifest(Buffer.concat(this.parts).toString("utf8"));
      this.parts = null;
    }
    return Promise.resolve();
  }
}

/**
 * Runs `archive` (tar + zstd) through `sink`; stops early (the decompressor killed) once
 * `done()` says so. A member the sink refuses stops everything at once.
 */
async function readArchive(archive: string, sink: TarSink, done: () => boolean): Promise<void> {
  const z = spawn("zstd", ["-d", "-q", "-c", "--no-progress", archive], {
    stdio: ["ignore", "pipe", "pipe"],
    env: childEnv(),
  });
  let zerr = "";
  z.stderr.on("data", (c: Buffer) => (zerr = (zerr + c.toString()).slice(-2000)));
  const exited = new Promise<number | null>((r) => {
    z.once("close", r);
    z.once("error", (e) => {
      zerr = e.message;
      r(null);
    });
  });
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    z.kill("SIGKILL");
  }, READ_TIMEOUT_MS);
  try {
    const reader = new TarReader(sink, PACK_TAR);
    let trailing = 0;
    for await (const chunk of z.stdout as AsyncIterable<Buffer>) {
      if (reader.ended) {
        // The end-of-archive padding: decompressed, not used, and not without end.
        trailing += chunk.length;
        if (trailing > MAX_TRAILING) {
          throw new ForkdError("invalid_argument", "not a readable pack: data after the end of the archive");
        }
        continue;
      }
      await reader.push(chunk);
      if (done()) return;
    }
    const code = await exited;
    if (timedOut) throw new ForkdError("timeout", "reading the pack took too long");
    if (code !== 0) {
      throw new ForkdError(
        "invalid_argument",
        `not a readable pack: ${
          zerr
            .trim()
            .replace(/^zstd: /, "")
            .split(archive)
            .join("pack") // no host path in a tenant's error
            .slice(0, 300) || `zstd exit ${code}`
        }`,
      );
    }
    reader.finish();
  } finally {
    clearTimeout(timer);
    if (z.exitCode === null && z.signalCode === null) z.kill("SIGKILL");
    await exited;
  }
}

/**
 * Reads a pack from `input` and registers its chain. Returns the tags published.
 *
 * The body is kept compressed (at most the route's pack bound); a first pass reads up to
 * manifest.json (a pack's first member since packs put it there; older packs have it last and
 * cost a full pass, as listing them did), writing nothing; the second extracts, every file
 * bounded by the size that manifest states and the whole by the unpack limit, and hashes as
 * it writes.
 */
/** Progress lines while a pack is received: at most one per this many bytes. */
const RECEIVE_STEP = 16 << 20;

/** Passes bytes through, reporting the count every RECEIVE_STEP bytes (phase "receive"). */
function receiveMeter(progress: Progress, totalBytes: number | undefined): Transform {
  let done = 0;
  let next = RECEIVE_STEP;
  return new Transform({
    transform(chunk: Buffer, _e, cb) {
      done += chunk.length;
      if (done >= next) {
        next = done + RECEIVE_STEP;
        progress(`received ${(done / 2 ** 20).toFixed(1)} MiB`, {
          phase: "receive",
          done_bytes: done,
          ...(totalBytes !== undefined ? { total_bytes: totalBytes } : {}),
        });
      }
      cb(null, chunk);
    },
  });
}

export async function unpackSnapshot(
  deps: UnpackDeps,
  input: Readable,
  o: { as?: string; progress?: Progress; totalBytes?: number } = {},
): Promise<Registered> {
  const progress: Progress = o.progress ?? (() => undefined);
  const dir = deps.store.stagingDir(stagingName("unpack"));
  const archive = `${dir}.tar.zst`;
  let writer: PackWriter | null = null;
  try {
    // Consume `input` before anything else is awaited (its errors need a listener).
    await pipeline(input, receiveMeter(progress, o.totalBytes), createWriteStream(archive, { mode: 0o600 }));
    progress("verifying the pack: every file against its manifest", { phase: "verify" });
    const limit = await limitFor(deps);
    const finder = new ManifestFinder(new UnpackBudget(limit, maxPackFileSize));
    await readArchive(archive, finder, () => finder.manifest !== null);
    if (!finder.manifest) throw new ForkdError("invalid_argument", "pack has no manifest.json");
    const budget = new UnpackBudget(limit, maxPackFileSize);
    budget.state(finder.manifest.files, "manifest.json", finder.size);
    await mkdir(dir, { mode: 0o700 });
    writer = new PackWriter(dir, budget);
    await readArchive(archive, writer, () => false);
    await writer.close();
    await rm(archive, { force: true });
    deps.crash?.("unpack:extracted");
    progress("registering the chain", { phase: "register" });
    return await registerStaged(deps, dir, {
      ...(o.as !== undefined ? { as: o.as } : {}),
      verified: writer.sums,
    });
  } catch (e) {
    throw mapPackError(e);
  } finally {
    await writer?.close();
    await rm(dir, { recursive: true, force: true });
    await rm(archive, { force: true });
  }
}
