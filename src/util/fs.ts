/** Small filesystem helpers shared by the snapshot, branch and pack code. */
import { copyFile, link, stat } from "node:fs/promises";

export async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}

/**
 * Shares an immutable file under a second name (a hard link, no copy); copies it when the two
 * names are on different filesystems.
 */
export async function linkOrCopy(from: string, to: string): Promise<void> {
  await link(from, to).catch(async (e: NodeJS.ErrnoException) => {
    if (e.code !== "EXDEV") throw e;
    await copyFile(from, to);
  });
}
