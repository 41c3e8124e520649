/**
 * The backing file a qcow2 layer names, read from its header (no qemu-img: the collector reads
 * every layer of the cache and every snapshot's disk). A qcow2 layer depends on that file BY
 * PATH: the collector keeps what a kept layer is backed by.
 */
import { open } from "node:fs/promises";
import { dirname, resolve } from "node:path";

const QCOW2_MAGIC = 0x514649fb; // "QFI\xfb"
/** qemu's own limit on a backing file name. */
const MAX_NAME = 1023;

/**
 * The absolute path of `path`'s backing file; null when it is not a qcow2 image, has none, or
 * cannot be read. A relative name is relative to the layer's directory (as qemu reads it).
 */
export async function qcow2Backing(path: string): Promise<string | null> {
  let fh;
  try {
    fh = await open(path, "r");
  } catch {
    return null;
  }
  try {
    const head = Buffer.alloc(20);
    const { bytesRead } = await fh.read(head, 0, 20, 0);
    if (bytesRead < 20 || head.readUInt32BE(0) !== QCOW2_MAGIC) return null;
    const offset = head.readBigUInt64BE(8);
    const size = head.readUInt32BE(16);
    if (offset === 0n || size === 0 || size > MAX_NAME || offset > BigInt(Number.MAX_SAFE_INTEGER))
      return null;
    const name = Buffer.alloc(size);
    const r = await fh.read(name, 0, size, Number(offset));
    if (r.bytesRead !== size) return null;
    const text = name.toString("utf8");
    if (text.includes("\0")) return null;
    // A protocol prefix (json:, nbd:) is not a file of ours.
    if (/^[a-z][a-z0-9+.-]*:/.test(text) && !text.startsWith("/")) return null;
    return resolve(dirname(path), text);
  } catch {
    return null;
  } finally {
    await fh.close();
  }
}
