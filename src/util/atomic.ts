/** Atomic writes: write a temp file, fsync it, rename over the target, fsync the directory. */
import { randomBytes } from "node:crypto";
import { open, rename, rm } from "node:fs/promises";
import { dirname, basename, join } from "node:path";

export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

export async function writeFileAtomic(path: string, data: string | Uint8Array, mode = 0o644): Promise<void> {
  const dir = dirname(path);
  const tmp = join(dir, `.${basename(path)}.tmp-${randomBytes(6).toString("hex")}`);
  const fh = await open(tmp, "wx", mode);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } catch (e) {
    await fh.close();
    await rm(tmp, { force: true });
    throw e;
  }
  await fh.close();
  try {
    await rename(tmp, path);
  } catch (e) {
    await rm(tmp, { force: true });
    throw e;
  }
  await fsyncDir(dir);
}

export async function writeJsonAtomic(path: string, value: unknown, mode = 0o644): Promise<void> {
  await writeFileAtomic(path, JSON.stringify(value, null, 2) + "\n", mode);
}
