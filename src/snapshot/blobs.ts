/**
 * Registry blobs of snapshot files: each file zstd-compressed on its own, deterministically
 * (one zstd version, level 3, single-threaded, from the file so the frame records its size), so
 * the same file gives the same blob digest and a base shared by many snapshots is one blob.
 *
 * The mapping file sha256 → blob digest is kept in <data>/registry/blobs/<sha256>.json, keyed
 * also by the compressor's identity, so pushing a base again costs a HEAD, not a compression.
 * Each record also remembers the repositories the blob was pushed to (for cross-repository
 * mounts). Decompression streams into a sparse file and stops at the size the manifest gives.
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdir, open, readFile } from "node:fs/promises";
import { join } from "node:path";
import { pipeline } from "node:stream/promises";
import { Transform, Writable } from "node:stream";
import type { Readable } from "node:stream";
import { z } from "zod";
import { writeJsonAtomic } from "../util/index.js";
import { ForkdError } from "../util/index.js";
import { childEnv, run } from "../util/index.js";

const LEVEL = 3;
const MAX_REPOS = 16;
const SHA_RE = /^[0-9a-f]{64}$/;

const BlobRecordSchema = z.object({
  sha256: z.string().regex(SHA_RE),
  size: z.number().int().nonnegative(),
  compressor: z.string(),
  digest: z.string().regex(/^sha256:[0-9a-f]{64}$/),
  compressedSize: z.number().int().nonnegative(),
  /** `host/name` of repositories this blob was pushed to, most recent first. */
  repos: z.array(z.string()).max(MAX_REPOS),
});
export type BlobRecord = z.infer<typeof BlobRecordSchema>;

export class BlobCache {
  private compressorId: Promise<string> | null = null;

  constructor(private readonly dir: string) {}

  /** zstd's version and our settings: a record made by another compressor does not count. */
  compressor(): Promise<string> {
    return (this.compressorId ??= run("zstd", ["-V"]).then(
      ({ stdout }) => `${/v\d+\.\d+\.\d+/.exec(stdout)?.[0] ?? stdout.trim()} -${LEVEL} --single-thread`,
    ));
  }

  private recordPath(sha256: string): string {
    if (!SHA_RE.test(sha256)) throw new ForkdError("invalid_argument", "bad sha256");
    return join(this.dir, `${sha256}.json`);
  }

  async lookup(sha256: string, size: number): Promise<BlobRecord | null> {
    try {
      const r = BlobRecordSchema.parse(JSON.parse(await readFile(this.recordPath(sha256), "utf8")));
      return r.sha256 === sha256 && r.size === size && r.compressor === (await this.compressor()) ? r : null;
    } catch {
      return null;
    }
  }

  private async save(r: BlobRecord): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    await writeJsonAtomic(this.recordPath(r.sha256), r, 0o600);
  }

  /** Notes that `repo` (host/name) has the blob now. */
  async noteRepo(r: BlobRecord, repo: string): Promise<BlobRecord> {
    const next = { ...r, repos: [repo, ...r.repos.filter((x) => x !== repo)].slice(0, MAX_REPOS) };
    await this.save(next);
    return next;
  }

  /** Compresses `path` (of the given sha256 and size) into `out` and records the mapping. */
  async compress(path: string, sum: { sha256: string; size: number }, out: string): Promise<BlobRecord> {
    const compressor = await this.compressor();
    const z = spawn("zstd", ["-q", `-${LEVEL}`, "--single-thread", "--no-progress", "-c", path], {
      stdio: ["ignore", "pipe", "pipe"],
      env: childEnv(),
    });
    let err = "";
    z.stderr.on("data", (c: Buffer) => (err = (err + c.toString()).slice(-2000)));
    const exited = new Promise<number | null>((r) => z.once("close", r));
    const h = createHash("sha256");
    let size = 0;
    const count = new Transform({
      transform(chunk: Buffer, _e, cb) {
        h.update(chunk);
        size += chunk.length;
        cb(null, chunk);
      },
    });
    try {
      await pipeline(z.stdout, count, createWriteStream(out, { flags: "wx", mode: 0o600 }));
    } catch (e) {
      z.kill("SIGKILL");
      throw e;
    }
    if ((await exited) !== 0) throw new ForkdError("internal", `zstd failed on ${path}: ${err.trim()}`);
    const digest = `sha256:${h.digest("hex")}`;
    const prev = await this.lookup(sum.sha256, sum.size);
    const r: BlobRecord = {
      sha256: sum.sha256,
      size: sum.size,
      compressor,
      digest,
      compressedSize: size,
      repos: prev?.digest === digest ? prev.repos : [],
    };
    await this.save(r);
    return r;
  }
}

/**
 * Decompresses `input` (one zstd blob; consumed at once, so it may be a stream that was just
 * opened) into a new sparse file `out` that must come to exactly
 * `size` bytes: output beyond it stops the decompressor at once (a small blob cannot fill the
 * disk), all-zero chunks become holes.
 */
export async function decompressTo(input: Readable, out: string, size: number): Promise<void> {
  const z = spawn("zstd", ["-d", "-q", "--no-progress", "-c"], {
    stdio: ["pipe", "pipe", "pipe"],
    env: childEnv(),
  });
  let err = "";
  z.stderr.on("data", (c: Buffer) => (err = (err + c.toString()).slice(-2000)));
  const exited = new Promise<number | null>((r) => z.once("close", r));
  const file = open(out, "wx", 0o600);
  file.catch(() => undefined); // awaited by the writes and below
  let pos = 0;
  let zero = Buffer.alloc(1 << 16);
  const sink = new Writable({
    write(c: Buffer, _e, cb) {
      if (pos + c.length > size) {
        cb(new ForkdError("invalid_argument", `${out}: decompresses to more than the ${size} bytes listed`));
        return;
      }
      const at = pos;
      pos += c.length;
      if (zero.length < c.length) zero = Buffer.alloc(c.length);
      if (c.equals(zero.subarray(0, c.length))) return cb(); // a hole
      file.then((fh) => fh.write(c, 0, c.length, at)).then(() => cb(), cb);
    },
  });
  // Both pipes start now, before any await: an input that fails at once must find a listener,
  // and Node discards a child's unread output when it exits.
  const feeding = pipeline(input, z.stdin);
  const writing = pipeline(z.stdout, sink);
  feeding.catch(() => undefined);
  writing.catch(() => undefined);
  try {
    await Promise.all([feeding, writing]).catch(async (e: unknown) => {
      // zstd quitting on bad input shows here as a broken pipe: say what zstd said.
      const pipeCode = (e as NodeJS.ErrnoException | null)?.code;
      if (pipeCode === "EPIPE" || pipeCode === "ERR_STREAM_PREMATURE_CLOSE") {
        const t = setTimeout(() => z.kill("SIGKILL"), 2_000);
        await exited;
        clearTimeout(t);
        if (err.trim())
          throw new ForkdError("invalid_argument", `${out}: not a valid zstd blob: ${err.trim()}`);
      }
      z.kill("SIGKILL");
      throw e;
    });
    const code = await exited;
    if (code !== 0) {
      throw new ForkdError(
        "invalid_argument",
        `${out}: not a valid zstd blob: ${err.trim() || `exit ${code}`}`,
      );
    }
    if (pos !== size) {
      throw new ForkdError("invalid_argument", `${out}: decompresses to ${pos} bytes, ${size} listed`);
    }
    const fh = await file;
    await fh.truncate(size);
    await fh.sync();
  } finally {
    if (z.exitCode === null) z.kill("SIGKILL");
    await (await file.catch(() => null))?.close();
  }
}
