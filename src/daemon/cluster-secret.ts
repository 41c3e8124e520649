/**
 * The cluster secret (FORKD_CLUSTER_SECRET_FILE): the key peers authenticate each other with,
 * read once at start from a regular file that only its owner may read (no group or other
 * permission bits, like 0600 or 0400) and that holds at least 32 bytes (a trailing newline is
 * not part of it: `openssl rand -hex 32 > FILE` makes a good one).
 */
import { open } from "node:fs/promises";
import { ForkdError } from "../util/index.js";

export const MIN_SECRET_BYTES = 32;
const MAX_SECRET_BYTES = 4096;

export async function readClusterSecret(path: string): Promise<Buffer> {
  const bad = (why: string) =>
    new ForkdError("invalid_argument", `FORKD_CLUSTER_SECRET_FILE ${path}: ${why}`, {
      field: "FORKD_CLUSTER_SECRET_FILE",
    });
  const fh = await open(path, "r").catch((e: unknown) => {
    throw bad(`cannot be read (${(e as NodeJS.ErrnoException).code ?? String(e)})`);
  });
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw bad("not a regular file");
    if ((st.mode & 0o077) !== 0)
      throw bad(
        `its mode is ${(st.mode & 0o777).toString(8)}: make it 0600 (chmod 600), readable by its owner alone`,
      );
    if (st.size > MAX_SECRET_BYTES) throw bad(`larger than ${MAX_SECRET_BYTES} bytes`);
    const raw = await fh.readFile();
    let end = raw.length;
    while (end > 0 && (raw[end - 1] === 0x0a || raw[end - 1] === 0x0d)) end--;
    const secret = raw.subarray(0, end);
    if (secret.length < MIN_SECRET_BYTES)
      throw bad(`holds ${secret.length} bytes; a cluster secret needs at least ${MIN_SECRET_BYTES}`);
    return Buffer.from(secret);
  } finally {
    await fh.close();
  }
}
