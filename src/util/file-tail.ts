/**
 * The last bytes of a file (at most `max`), read in one bounded read; null when there is no
 * regular file there. Files a jailed VMM may replace (its console log) are read through this:
 * the last component is never followed as a symbolic link, and a FIFO or device opens without
 * blocking and is refused, so a hostile VMM cannot make the daemon (root) read a host file for
 * it, or hang on a read.
 */
import { constants } from "node:fs";
import { open } from "node:fs/promises";

export async function readFileTail(
  path: string,
  max: number,
): Promise<{ bytes: Buffer; size: number } | null> {
  let fh;
  try {
    fh = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch {
    return null;
  }
  try {
    const st = await fh.stat();
    if (!st.isFile()) return null;
    const n = Math.min(st.size, max);
    const buf = Buffer.alloc(n);
    const { bytesRead } = await fh.read(buf, 0, n, st.size - n);
    return { bytes: buf.subarray(0, bytesRead), size: st.size };
  } finally {
    await fh.close();
  }
}
