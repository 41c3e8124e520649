/**
 * Flatten: an image's layers (uncompressed tars, in order) applied into a staging directory
 * the way a container runtime's overlay would show them: whiteouts (`.wh.NAME`) remove what
 * lower layers made, an opaque marker (`.wh..wh..opq`) empties a directory of everything lower
 * layers put in it, later entries replace earlier ones; hard links, symlinks, FIFOs, modes
 * (setuid included), numeric owners, mtimes and xattrs are kept.
 *
 * Character and block device nodes (a debootstrap tree's /dev/null, /dev/full, ...) are never
 * made on the host: each is skipped and counted (what was below it is still replaced, and a
 * hard link to a skipped node is skipped too); the guest's /dev is the kernel's devtmpfs, which
 * has its own. Layers are untrusted: an entry is refused, naming it, when it would land outside
 * the root (a `..` component), when its parent path goes through a symlink or a non-directory
 * (also one an earlier layer made), or when it is a hard link out of the root, to an absolute
 * path, through a symlink or to a directory; a skipped device node is checked the same way
 * first. The tree is bounded in bytes and in entries before anything past the bound is written.
 * Files are created with O_EXCL|O_NOFOLLOW after what was there is removed, so nothing is ever
 * written through a link. The caller owns the staging directory and removes it when this throws.
 */
import { constants } from "node:fs";
import {
  lstat,
  lchown,
  link,
  lutimes,
  mkdir,
  open,
  readdir,
  rm,
  symlink,
  chmod,
  chown,
  utimes,
} from "node:fs/promises";
import type { FileHandle } from "node:fs/promises";
import { createReadStream } from "node:fs";
import { join } from "node:path";
import { ForkdError, errorMessage, isForkdError } from "../util/index.js";
import { run } from "../util/index.js";
import type { Progress } from "../util/index.js";
import { TarReader } from "../archive/index.js";
import type { TarEntry, TarSink } from "../archive/index.js";
import { layerTar } from "../archive/index.js";
import { OPAQUE, WHITEOUT, components, linkTarget } from "./layer-path.js";
import { MAX_XATTR_VALUE, setXattr, xattrApplies } from "./xattr.js";

export interface FlattenLimits {
  /** The tree's regular files may add up to at most this many bytes. */
  maxBytes: number;
  /** At most this many entries over all layers. */
  maxEntries: number;
}

export interface FlattenLayer {
  /** The uncompressed tar. */
  path: string;
  /** Its digest (diff_id), for messages and progress. */
  digest: string;
  size: number;
}

export interface FlattenOptions {
  root: string;
  layers: FlattenLayer[];
  limits: FlattenLimits;
  progress?: Progress;
  signal?: AbortSignal;
}

export interface FlattenResult {
  /** Regular files' bytes in the tree (a hard-linked file counted once). */
  sizeBytes: number;
  entries: number;
  /** Extended attributes in namespaces not applied (security.selinux, …). */
  xattrsSkipped: number;
  /** Character and block device nodes not made (and hard links to them). */
  devicesSkipped: number;
}

interface DirMeta {
  mode: number;
  uid: number;
  gid: number;
  mtime: number;
}

/** Extended attributes an image may set (one setfattr each: a bound on the time they take). */
const MAX_XATTRS = 65_536;
/** uid and gid at most (2^32-1 is "no owner" to chown). */
const MAX_ID = 0xfffffffe;

const asRoot = (): boolean => process.getuid?.() === 0;

async function lstatOrNull(p: string) {
  try {
    return await lstat(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw e;
  }
}

/** The state of one flatten: what a layer sink needs across entries and layers. */
class Flattener implements TarSink {
  private entries = 0;
  private bytes = 0;
  xattrsSkipped = 0;
  devicesSkipped = 0;
  /** Paths (relative) of skipped device nodes nothing has replaced since: a hard link to one is skipped. */
  private readonly skippedDevices = new Set<string>();
  private xattrsSet = 0;
  /** Directories' metadata, applied once every layer is in (children change a dir's mtime). */
  private readonly dirs = new Map<string, DirMeta>();
  /** Paths (relative, "/"-joined) the current layer wrote, and their parents: an opaque marker keeps them. */
  private layerPaths = new Set<string>();
  private what = "";
  private file: { fh: FileHandle; e: TarEntry; path: string; rel: string } | null = null;
  /** Relative paths checked (or made) as real directories, not symlinks: parents() skips them. */
  private readonly realDirs = new Set<string>();
  /** The current entry is a whiteout (a file entry written as nothing): its data is dropped. */
  private discard = false;

  constructor(private readonly o: FlattenOptions) {}

  get entryCount(): number {
    return this.entries;
  }

  startLayer(what: string): void {
    this.what = what;
    this.layerPaths = new Set();
  }

  private refuse(entry: string, why: string): ForkdError {
    return new ForkdError("invalid_argument", `${this.what}: entry ${JSON.stringify(entry)}: ${why}`, {
      entry,
    });
  }

  /**
   * Makes sure every parent of `parts` is a real directory in the tree (missing ones are made,
   * as runtimes do): never a symlink, never a file.
   */
  private async parents(parts: string[], entry: string): Promise<void> {
    let p = this.o.root;
    for (let i = 0; i < parts.length - 1; i++) {
      p = join(p, parts[i] ?? "");
      const rel = parts.slice(0, i + 1).join("/");
      if (this.realDirs.has(rel)) continue;
      const st = await lstatOrNull(p);
      if (st === null) {
        await mkdir(p, { mode: 0o755 });
        this.realDirs.add(rel);
        continue;
      }
      if (st.isSymbolicLink())
        throw this.refuse(entry, `its parent /${rel} is a symlink (an entry may not be written through one)`);
      if (!st.isDirectory()) throw this.refuse(entry, `its parent /${rel} is not a directory`);
      this.realDirs.add(rel);
    }
  }

  /**
   * Removes `rel` (and what is under it) from the tree. A directory also leaves the pending
   * directory metadata and the directories known to be real (the only writer of the tree is
   * this flatten: a known directory changes only here).
   */
  private async remove(abs: string, rel: string, isDir: boolean): Promise<void> {
    await rm(abs, { recursive: true, force: true });
    if (!isDir) return;
    this.forgetSkipped(rel, () => true);
    this.realDirs.clear();
    for (const k of this.dirs.keys()) if (k === rel || k.startsWith(`${rel}/`)) this.dirs.delete(k);
  }

  private async owner(abs: string, e: TarEntry, isLink: boolean): Promise<void> {
    if (!asRoot()) return;
    if (isLink) await lchown(abs, e.uid, e.gid);
    else await chown(abs, e.uid, e.gid);
  }

  private async xattrs(abs: string, e: TarEntry): Promise<void> {
    for (const [name, value] of e.xattrs) {
      if (!xattrApplies(name)) {
        this.xattrsSkipped++;
        continue;
      }
      if (++this.xattrsSet > MAX_XATTRS) {
        throw this.refuse(e.name, `the image has more than ${MAX_XATTRS} extended attributes`);
      }
      if (name.length > 255 || value.length > MAX_XATTR_VALUE)
        throw this.refuse(e.name, `xattr ${JSON.stringify(name.slice(0, 100))} is too large`);
      await setXattr(abs, name, value);
    }
  }

  async entry(e: TarEntry): Promise<void> {
    if (this.o.signal?.aborted)
      throw this.o.signal.reason instanceof Error
        ? this.o.signal.reason
        : new ForkdError("timeout", "aborted");
    if (++this.entries > this.o.limits.maxEntries) {
      throw new ForkdError(
        "payload_too_large",
        `${this.what}: the image has more than ${this.o.limits.maxEntries} entries`,
        { limit_entries: this.o.limits.maxEntries },
      );
    }
    this.discard = e.type === "file";
    const parts = components(e.name, this.what, e.name);
    if (e.uid > MAX_ID || e.gid > MAX_ID)
      throw this.refuse(e.name, `owner ${e.uid}:${e.gid} is out of range`);
    const base = parts[parts.length - 1] ?? "";
    if (parts.length === 0) {
      if (e.type !== "dir") throw this.refuse(e.name, `the root is a ${e.type}`);
      this.dirs.set("", { mode: e.mode, uid: e.uid, gid: e.gid, mtime: e.mtime });
      return;
    }
    await this.parents(parts, e.name);
    const parentRel = parts.slice(0, -1).join("/");
    const parentAbs = join(this.o.root, ...parts.slice(0, -1));
    if (base === OPAQUE) {
      await this.opaque(parentAbs, parentRel);
      return;
    }
    if (base.startsWith(WHITEOUT)) {
      if (base.startsWith(`${WHITEOUT}${WHITEOUT}`)) return; // other AUFS metadata (.wh..wh.plnk, …): not content
      const victim = base.slice(WHITEOUT.length);
      if (victim === "" || victim === "." || victim === "..")
        throw this.refuse(e.name, "a whiteout of nothing");
      const rel = parentRel ? `${parentRel}/${victim}` : victim;
      const st = await lstatOrNull(join(parentAbs, victim));
      if (st) await this.remove(join(parentAbs, victim), rel, st.isDirectory());
      this.forgetSkipped(rel, () => true);
      return;
    }
    const rel = parts.join("/");
    const abs = join(this.o.root, ...parts);
    // Its parents too: a layer may write a/b/new without an a/b entry (parents() makes a/b),
    // and its own opaque marker in a/ must not remove a/b with what it just wrote.
    for (let i = 1; i <= parts.length; i++) this.layerPaths.add(parts.slice(0, i).join("/"));
    const existing = await lstatOrNull(abs);
    const linkRel = e.type === "hardlink" ? linkTarget(e.linkname, this.what, e.name).join("/") : null;
    const toSkipped = linkRel !== null && this.skippedDevices.has(linkRel);
    if (toSkipped && linkRel === rel) return; // a link to itself: nothing to do
    if (e.type === "char" || e.type === "block" || toSkipped) {
      // Never made on the host (a hard link to a skipped node is one too); what it replaces
      // goes all the same.
      if (existing) await this.remove(abs, rel, existing.isDirectory());
      this.skippedDevices.add(rel);
      this.devicesSkipped++;
      return;
    }
    this.skippedDevices.delete(rel);
    if (e.type === "dir") {
      if (existing && !existing.isDirectory()) await this.remove(abs, rel, false);
      if (!existing || !existing.isDirectory()) await mkdir(abs, { mode: 0o700 });
      this.realDirs.add(rel);
      this.dirs.set(rel, { mode: e.mode, uid: e.uid, gid: e.gid, mtime: e.mtime });
      if (e.xattrs.size > 0) await this.xattrs(abs, e);
      return;
    }
    if (e.type === "hardlink") {
      // Checked before anything is removed: a refused link changes nothing.
      const target = linkTarget(e.linkname, this.what, e.name);
      await this.checkLinkTarget(target, e);
      if (target.join("/") === rel) return; // a link to itself: nothing to do
    }
    if (existing) await this.remove(abs, rel, existing.isDirectory());
    switch (e.type) {
      case "file": {
        if (this.bytes + e.size > this.o.limits.maxBytes) {
          throw new ForkdError(
            "payload_too_large",
            `${this.what}: entry ${JSON.stringify(e.name)}: the image's files add up to more than ${this.o.limits.maxBytes} bytes`,
            { entry: e.name, limit_bytes: this.o.limits.maxBytes },
          );
        }
        this.bytes += e.size;
        this.discard = false;
        const fh = await open(
          abs,
          constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
          0o600,
        );
        this.file = { fh, e, path: abs, rel };
        return;
      }
      case "symlink":
        await symlink(e.linkname, abs);
        await this.owner(abs, e, true);
        await this.xattrs(abs, e);
        await lutimes(abs, e.mtime, e.mtime);
        return;
      case "hardlink": {
        const target = linkTarget(e.linkname, this.what, e.name);
        await link(join(this.o.root, ...target), abs);
        return;
      }
      case "fifo":
        await run("mkfifo", ["--", abs], { timeoutMs: 10_000 });
        await this.owner(abs, e, false);
        await chmod(abs, e.mode);
        await this.xattrs(abs, e);
        await utimes(abs, e.mtime, e.mtime);
        return;
    }
  }

  /** A hard link's target: in the tree already, reached through real directories, not a directory. */
  private async checkLinkTarget(target: string[], e: TarEntry): Promise<void> {
    let p = this.o.root;
    for (let i = 0; i < target.length; i++) {
      p = join(p, target[i] ?? "");
      const st = await lstatOrNull(p);
      const rel = target.slice(0, i + 1).join("/");
      if (st === null) throw this.refuse(e.name, `hard link to /${target.join("/")}, which does not exist`);
      if (i < target.length - 1) {
        if (st.isSymbolicLink()) throw this.refuse(e.name, `hard link through a symlink (/${rel})`);
        if (!st.isDirectory()) throw this.refuse(e.name, `hard link through a non-directory (/${rel})`);
      } else if (st.isDirectory()) {
        throw this.refuse(e.name, `hard link to a directory (/${rel})`);
      }
    }
  }

  /** Skipped device nodes at `rel` or under it that `gone` says are gone (nothing on disk tells). */
  private forgetSkipped(rel: string, gone: (path: string) => boolean): void {
    for (const k of this.skippedDevices) {
      if ((rel === "" || k === rel || k.startsWith(`${rel}/`)) && gone(k)) this.skippedDevices.delete(k);
    }
  }

  /** Everything under `dirAbs` that an earlier layer made goes; what this layer wrote stays. */
  private async opaque(dirAbs: string, dirRel: string): Promise<void> {
    this.forgetSkipped(dirRel, (k) => k !== dirRel && !this.layerPaths.has(k));
    const walk = async (abs: string, rel: string): Promise<void> => {
      for (const d of await readdir(abs, { withFileTypes: true })) {
        const r = rel ? `${rel}/${d.name}` : d.name;
        const a = join(abs, d.name);
        if (!this.layerPaths.has(r)) await this.remove(a, r, d.isDirectory());
        else if (d.isDirectory()) await walk(a, r);
      }
    };
    await walk(dirAbs, dirRel);
  }

  async data(chunk: Buffer): Promise<void> {
    const f = this.file;
    if (!f) {
      if (this.discard) return;
      throw new ForkdError("internal", "layer data outside a file");
    }
    let at = 0;
    while (at < chunk.length) {
      const { bytesWritten } = await f.fh.write(chunk, at, chunk.length - at);
      at += bytesWritten;
    }
  }

  async end(): Promise<void> {
    const f = this.file;
    if (!f) {
      if (this.discard) return;
      throw new ForkdError("internal", "layer data outside a file");
    }
    this.file = null;
    try {
      if (asRoot()) await f.fh.chown(f.e.uid, f.e.gid);
      await f.fh.chmod(f.e.mode); // after chown, which clears setuid/setgid
      await f.fh.utimes(f.e.mtime, f.e.mtime);
    } finally {
      await f.fh.close();
    }
    // After chown (which clears security.capability); setfattr leaves the mtime as it is.
    await this.xattrs(f.path, f.e);
  }

  async abandon(): Promise<void> {
    const f = this.file;
    this.file = null;
    await f?.fh.close().catch(() => undefined);
  }

  /** Directories' owners, modes and mtimes, once every layer is in (deepest first). */
  async finishDirs(): Promise<void> {
    const all = [...this.dirs.entries()].sort((a, b) => b[0].split("/").length - a[0].split("/").length);
    for (const [rel, m] of all) {
      const abs = rel === "" ? this.o.root : join(this.o.root, ...rel.split("/"));
      const st = await lstatOrNull(abs);
      if (!st?.isDirectory()) continue;
      if (asRoot()) await chown(abs, m.uid, m.gid);
      await chmod(abs, m.mode);
      await utimes(abs, m.mtime, m.mtime);
    }
  }
}

/** Regular files' bytes under `root`, each inode once. */
async function treeSize(root: string): Promise<number> {
  const seen = new Set<string>();
  let total = 0;
  const walk = async (dir: string): Promise<void> => {
    for (const d of await readdir(dir, { withFileTypes: true })) {
      const p = join(dir, d.name);
      if (d.isDirectory()) await walk(p);
      else if (d.isFile()) {
        const st = await lstat(p);
        const key = `${st.dev}:${st.ino}`;
        if (st.nlink > 1) {
          if (seen.has(key)) continue;
          seen.add(key);
        }
        total += st.size;
      }
    }
  };
  await walk(root);
  return total;
}

export async function flattenLayers(o: FlattenOptions): Promise<FlattenResult> {
  const f = new Flattener(o);
  const count = o.layers.length;
  const total = o.layers.reduce((a, l) => a + l.size, 0);
  let done = 0;
  for (const [i, layer] of o.layers.entries()) {
    const what = `layer ${i + 1}/${count} (${layer.digest})`;
    f.startLayer(what);
    o.progress?.(`flattening layer ${i + 1}/${count}`, {
      phase: "flatten",
      layer: { index: i + 1, count, path: layer.digest },
      done_bytes: done,
      total_bytes: total,
    });
    const reader = new TarReader(f, layerTar(what, o.limits.maxEntries));
    const stream = createReadStream(layer.path, { highWaterMark: 1 << 20 });
    try {
      for await (const chunk of stream as AsyncIterable<Buffer>) {
        await reader.push(chunk);
        done += chunk.length;
      }
      reader.finish();
    } catch (e) {
      stream.destroy();
      await f.abandon();
      if (isForkdError(e)) throw e;
      throw new ForkdError("image_error", `${what}: ${errorMessage(e)}`, {}, e);
    }
  }
  await f.finishDirs();
  if (f.devicesSkipped > 0) {
    o.progress?.(
      `skipped ${f.devicesSkipped} device node${f.devicesSkipped === 1 ? "" : "s"} (never made on the host; the guest's /dev is its own devtmpfs)`,
      { phase: "flatten" },
    );
  }
  o.progress?.("flattened", { phase: "flatten", done_bytes: total, total_bytes: total });
  return {
    sizeBytes: await treeSize(o.root),
    entries: f.entryCount,
    xattrsSkipped: f.xattrsSkipped,
    devicesSkipped: f.devicesSkipped,
  };
}
