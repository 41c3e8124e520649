/**
 * A diff snapshot's memory made a full image again: `base` with the runs of a forkd-memsnap diff
 * (native/memsnap/forkd-memsnap.c: "FKMDIFF1", u64 page size, u64 mapping size, runs of
 * {u64 offset, u64 length, bytes}, a run of length 0) written over it. What compact, a forced
 * delete of a memory base and a pack for an older reader need; forks never do this (restore.ts
 * writes the diff into the child instead).
 */
import { constants } from "node:fs";
import { chmod, copyFile, open, rm, stat } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import { ForkdError } from "../util/index.js";

const MAGIC = "FKMDIFF1";
const CHUNK = 8 << 20;

async function readExactly(
  f: FileHandle,
  buf: Buffer,
  len: number,
  pos: number,
  what: string,
): Promise<void> {
  for (let got = 0; got < len;) {
    const { bytesRead } = await f.read(buf, got, len - got, pos + got);
    if (bytesRead === 0) throw new ForkdError("snapshot_corrupt", `memory diff ${what} is truncated`);
    got += bytesRead;
  }
}

/**
 * Writes `out` (0444, fsynced): `base` (a copy: reflinked where the filesystem can) with `diff`'s
 * pages over it. A diff whose runs leave the image, or that ends early, is snapshot_corrupt and
 * leaves no `out`.
 */
export async function applyMemoryDiff(base: string, diff: string, out: string): Promise<void> {
  const size = (await stat(base)).size;
  await copyFile(base, out, constants.COPYFILE_EXCL | constants.COPYFILE_FICLONE);
  try {
    await chmod(out, 0o600);
    const d = await open(diff, "r");
    let o: FileHandle | null = null;
    try {
      o = await open(out, "r+");
      const head = Buffer.alloc(24);
      await readExactly(d, head, 24, 0, diff);
      if (head.subarray(0, 8).toString("latin1") !== MAGIC)
        throw new ForkdError("snapshot_corrupt", `${diff} is not a forkd memory diff`);
      // The header names the page size and the size of the mapping it was taken of: a diff of
      // another guest's RAM is refused, not laid over this image.
      if (Number(head.readBigUInt64LE(16)) !== size)
        throw new ForkdError("snapshot_corrupt", `memory diff ${diff} was taken of a memory of another size`);
      const buf = Buffer.alloc(CHUNK);
      let pos = 24;
      for (;;) {
        await readExactly(d, head, 16, pos, diff);
        pos += 16;
        const off = Number(head.readBigUInt64LE(0));
        const len = Number(head.readBigUInt64LE(8));
        if (len === 0) break;
        if (!Number.isSafeInteger(off) || !Number.isSafeInteger(len) || off + len > size)
          throw new ForkdError("snapshot_corrupt", `memory diff ${diff} has a run outside the image`);
        for (let done = 0; done < len;) {
          const n = Math.min(CHUNK, len - done);
          await readExactly(d, buf, n, pos, diff);
          for (let w = 0; w < n;) {
            const { bytesWritten } = await o.write(buf, w, n - w, off + done + w);
            w += bytesWritten;
          }
          pos += n;
          done += n;
        }
      }
      await o.sync();
    } finally {
      await Promise.all([d.close(), o?.close()]);
    }
    await chmod(out, 0o444);
  } catch (e) {
    await rm(out, { force: true });
    throw e;
  }
}
