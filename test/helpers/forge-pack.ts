/**
 * Hand-made pack archives for hostile tests: a forger's own tar writer (plain ustar members of
 * any stated size, filled with one byte or given bytes) streamed through zstd, so a tiny file
 * can hold gigabytes without the test ever writing them.
 */
import { spawn } from "node:child_process";
import { createWriteStream } from "node:fs";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";

/** A ustar header (a regular file unless `type` says otherwise). */
export function tarHeader(name: string, size: number, type = "0"): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0, "utf8");
  h.write("0000644\0", 100);
  h.write("0000000\0", 108);
  h.write("0000000\0", 116);
  h.write(size.toString(8).padStart(11, "0") + "\0", 124);
  h.write("00000000000\0", 136);
  h.write("        ", 148);
  h.write(type, 156);
  h.write("ustar\0" + "00", 257, "latin1");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148, "latin1");
  return h;
}

/** A member: its name, the size its header states, its content (a filler byte or bytes), its type. */
export type ForgedMember = [name: string, size: number, fill: number | Buffer, type?: string];

/** Streams a tar of `members` through `zstd -1` into `out`. */
export async function forgePack(out: string, members: ForgedMember[]): Promise<string> {
  async function* tar() {
    for (const [name, size, fill, type] of members) {
      yield tarHeader(name, size, type);
      if (Buffer.isBuffer(fill)) yield fill;
      else for (let left = size; left > 0; left -= 1 << 20) yield Buffer.alloc(Math.min(left, 1 << 20), fill);
      if (size % 512) yield Buffer.alloc(512 - (size % 512));
    }
    yield Buffer.alloc(1024);
  }
  const z = spawn("zstd", ["-q", "-1", "-c"], { stdio: ["pipe", "pipe", "inherit"] });
  await Promise.all([pipeline(Readable.from(tar()), z.stdin), pipeline(z.stdout, createWriteStream(out))]);
  return out;
}
