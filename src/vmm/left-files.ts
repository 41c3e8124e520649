/**
 * Files a jailed VMM wrote (its RAM, device state, disk layers), taken by the daemon once the VMM
 * is gone. What it left is not trusted: each must be a regular file with one link (not a link to
 * a host file the daemon would chown, hash or make readable, nor a FIFO), and is given to the
 * daemon without following a link (lchown) before it moves.
 */
import { copyFile, lchown, lstat, rename, rm } from "node:fs/promises";
import { basename } from "node:path";
import { ForkdError } from "../util/errors.js";

/**
 * Moves `from` (a file in a gone VMM's own directory) to `to`, owned by the daemon (copied across
 * file systems); `who` names the VM in the error ("the parent VM"). Returns its size.
 */
export async function takeVmmFile(from: string, to: string, who: string): Promise<number> {
  const st = await lstat(from).catch(() => null);
  if (!st?.isFile() || st.nlink !== 1)
    throw new ForkdError("vmm_error", `${who} left ${basename(from)} as something other than a file`);
  await lchown(from, process.getuid?.() ?? 0, process.getgid?.() ?? 0);
  await rename(from, to).catch(async (e: NodeJS.ErrnoException) => {
    if (e.code !== "EXDEV") throw e;
    await copyFile(from, to);
    await rm(from, { force: true });
  });
  return st.size;
}
