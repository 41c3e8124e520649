/** The last bytes of a file (at most `max`), read in one bounded read; null when there is no file. */
import { open } from "node:fs/promises";

export async function readFileTail(
  path: string,
  max: number,
): Promise<{ bytes: Buffer; size: number } | null> {
  let fh;
  try {
    fh = await open(path, "r");
  } catch {
    return null;
  }
  try {
    const { size } = await fh.stat();
    const n = Math.min(size, max);
    const buf = Buffer.alloc(n);
    const { bytesRead } = await fh.read(buf, 0, n, size - n);
    return { bytes: buf.subarray(0, bytesRead), size };
  } finally {
    await fh.close();
  }
}
