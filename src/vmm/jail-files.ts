/**
 * Files handed to a jailed process and taken back (a VMM's, a host tool's: ./jail.ts,
 * ./jailed-tools.ts). What a jailed process may have written is not trusted once it is gone: a
 * file taken back must still be a regular file with one link (not a link to a host file the
 * daemon would chown, hash or make readable, nor a FIFO that would block a reader), and it is
 * changed through a descriptor opened without following a link, so what was checked is what is
 * changed.
 */
import { constants } from "node:fs";
import { copyFile, lstat, open, rename, rm } from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import { basename } from "node:path";
import { ForkdError } from "../util/index.js";

const NOFOLLOW = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;

/** `path` opened without following a link, checked to be a regular file (with one link if `single`). */
async function openRegular(path: string, single: boolean): Promise<FileHandle> {
  const what = `${basename(path)} was left as something other than a file`;
  const fh = await open(path, NOFOLLOW).catch((e: NodeJS.ErrnoException) => {
    // ELOOP: a symlink in its place.
    throw e.code === "ELOOP" ? new ForkdError("vmm_error", what) : e;
  });
  try {
    const st = await fh.stat();
    if (!st.isFile() || (single && st.nlink !== 1)) throw new ForkdError("vmm_error", what);
    return fh;
  } catch (e) {
    await fh.close();
    throw e;
  }
}

/**
 * Takes back a file a jailed process had (or wrote): a regular file with one link, owned by the
 * daemon again (a chown by root also clears set-id bits), with `mode`.
 */
export async function takeBack(path: string, mode: number): Promise<void> {
  const fh = await openRegular(path, true);
  try {
    await fh.chown(process.getuid?.() ?? 0, process.getgid?.() ?? 0);
    await fh.chmod(mode);
  } finally {
    await fh.close();
  }
}

/** Hands `path` (a regular file with one link) to `uid`:`gid` for a jailed process to write. */
export async function handTo(path: string, uid: number, gid: number): Promise<void> {
  const fh = await openRegular(path, true);
  try {
    await fh.chown(uid, gid);
    await fh.chmod(0o600);
  } finally {
    await fh.close();
  }
}

/** Creates `path` (it must not exist), empty and mode 0600, for `uid`:`gid` to write. */
export async function createFor(path: string, uid: number, gid: number): Promise<void> {
  const fh = await open(
    path,
    constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
    0o600,
  );
  try {
    await fh.chown(uid, gid);
  } finally {
    await fh.close();
  }
}

/**
 * Makes the regular file `path` readable by group `gid` (the jail's), unless anyone may read it:
 * its owner stays (a VMM may still use its layer), its group becomes `gid`. Links are allowed (a
 * snapshot's layer is shared by hard links); a symlink or anything but a regular file is refused.
 */
export async function shareRead(path: string, gid: number): Promise<void> {
  const st = await lstat(path);
  if (!st.isFile()) throw new ForkdError("vmm_error", `${basename(path)} is not a regular file`);
  if ((st.mode & 0o004) !== 0 || (st.gid === gid && (st.mode & 0o040) !== 0)) return;
  const fh = await openRegular(path, false);
  try {
    const now = await fh.stat();
    if (now.gid !== gid) await fh.chown(now.uid, gid);
    await fh.chmod((now.mode & 0o777) | 0o040);
  } finally {
    await fh.close();
  }
}

/**
 * Moves `from` (a file in a gone VMM's own directory) to `to`, taken back (a regular file
 * with one link, the daemon's, mode 0600) first and copied across file systems; `who` names the
 * VM in the error ("the parent VM"). Returns its size.
 */
export async function takeVmmFile(from: string, to: string, who: string): Promise<number> {
  await takeBack(from, 0o600).catch((e: unknown) => {
    throw e instanceof ForkdError
      ? new ForkdError("vmm_error", `${who} left ${basename(from)} as something other than a file`)
      : e;
  });
  const { size } = await lstat(from);
  await rename(from, to).catch(async (e: NodeJS.ErrnoException) => {
    if (e.code !== "EXDEV") throw e;
    await copyFile(from, to);
    await rm(from, { force: true });
  });
  return size;
}
