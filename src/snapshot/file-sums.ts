/**
 * Sums of files this node holds whose sha256 no metadata records (a guest image's files, a
 * snapshot's meta.json), hashed once and kept while the file is unchanged: keyed by device,
 * inode, size and change time, so a file replaced or rewritten is hashed again. Packs and the
 * peer routes (a manifest, the blob index) read them; a concurrent ask for the same file shares
 * one hashing.
 */
import { stat } from "node:fs/promises";
import { sha256File } from "./meta.js";

export interface FileSum {
  size: number;
  sha256: string;
}

/** Entries kept at most (a node holds a few images and some hundreds of snapshots). */
const MAX_ENTRIES = 8192;

export class FileSums {
  private readonly known = new Map<string, { stamp: string; sum: Promise<FileSum> }>();

  /** The size and sha256 of `path` as it is now. */
  async of(path: string): Promise<FileSum> {
    const st = await stat(path);
    const stamp = `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}:${st.ctimeMs}`;
    const hit = this.known.get(path);
    if (hit?.stamp === stamp) return hit.sum;
    const sum = sha256File(path);
    if (this.known.size >= MAX_ENTRIES) this.known.clear();
    this.known.set(path, { stamp, sum });
    try {
      const s = await sum;
      // Changed while it was read: not kept (the next ask hashes it again).
      if (s.size !== st.size) this.known.delete(path);
      return s;
    } catch (e) {
      this.known.delete(path);
      throw e;
    }
  }
}
