/**
 * The one streaming tar reader, for every untrusted archive forkd reads: packs (src/snapshot/
 * unpack.ts), image layers (src/oci/flatten.ts) and Dockerfile build contexts
 * (src/image/dockerfile/context-tar.ts). One pass over the bytes, no temporary copy. It reads
 * ustar, GNU (long names `L` and link names `K`, old-GNU sparse members `S` with their extension
 * blocks) and pax (`x`: path, linkpath, size, uid, gid, mtime, `SCHILY.xattr.*`; `g`: checked,
 * not used). What a reader admits is its profile's (tar-profiles.ts): entry types, sparse
 * members, archives without the ustar magic, the size of an extended header and the number of
 * headers; every other entry is refused, naming it, before any of its data is read.
 *
 * Every archive: header checksums checked; numbers octal or base-256 within safe integers; no
 * NUL in a name; no data in anything but a file (a directory with data is refused); pax sparse
 * members refused; an archive that stops inside a member, or after an extended header, refused.
 * A member's data reaches the sink at its offset in the file (a sparse member's holes are never
 * materialised), in order, never beyond the size its header states, and only after the sink
 * admitted the header: the sink bounds what may be written before the first byte is.
 */
import { ForkdError } from "../util/index.js";
import {
  BLOCK,
  checkSparseMap,
  checksumOk,
  cstring,
  normalise,
  parseNumber,
  parsePax,
  sparseEntries,
} from "./tar-fields.js";
import type { Segment, TarEntryType } from "./tar-fields.js";
import type { TarProfile } from "./tar-profiles.js";

export interface TarEntry {
  /** Normalised: no leading "./", no trailing "/"; "" for the archive's root. */
  path: string;
  /** The name as the archive spells it (pax and GNU long names applied; for messages). */
  name: string;
  type: TarEntryType;
  /** The file's size (a sparse member: its real size, holes included). */
  size: number;
  /** Permission bits with setuid/setgid/sticky (mode & 0o7777). */
  mode: number;
  uid: number;
  gid: number;
  /** Seconds since the epoch. */
  mtime: number;
  /** Symlink target, or the hard link's target path in the archive. */
  linkname: string;
  /** From pax `SCHILY.xattr.NAME` records: NAME → value bytes. */
  xattrs: Map<string, Buffer>;
}

export interface TarSink {
  /** A member's header, before any of its data; throws to refuse it. */
  entry(e: TarEntry): Promise<void>;
  /** `chunk` of the current file at `offset` (increasing, never past its size). */
  data(chunk: Buffer, offset: number): Promise<void>;
  /** The current file is complete. */
  end(): Promise<void>;
}

const TYPES: Record<string, TarEntryType> = {
  "0": "file",
  "\0": "file",
  "7": "file",
  "1": "hardlink",
  "2": "symlink",
  "3": "char",
  "4": "block",
  "5": "dir",
  "6": "fifo",
};

type Extended = "longname" | "longlink" | "pax" | "global";
const EXTENDED: Record<string, Extended> = { L: "longname", K: "longlink", x: "pax", g: "global" };

type State =
  | { kind: "header" }
  | { kind: "meta"; what: Extended; left: number; pad: number; parts: Buffer[] }
  | { kind: "sparse-ext"; entry: TarEntry; stored: number; map: Segment[] }
  | { kind: "data"; map: Segment[]; seg: number; segLeft: number; pos: number; pad: number }
  | { kind: "end" };

const padOf = (size: number): number => (BLOCK - (size % BLOCK)) % BLOCK;

export class TarReader {
  private buf: Buffer = Buffer.alloc(0);
  private state: State = { kind: "header" };
  private longName: string | null = null;
  private longLink: string | null = null;
  private pax: Map<string, Buffer> | null = null;
  private headers = 0;

  constructor(
    private readonly sink: TarSink,
    private readonly profile: TarProfile,
  ) {}

  /** The error of a malformed archive, in the profile's words ("<label>: entry "x": why"). */
  private bad = (why: string, entry?: string): ForkdError =>
    new ForkdError(
      "invalid_argument",
      `${this.profile.label}: ${entry !== undefined ? `entry ${JSON.stringify(entry)}: ` : ""}${why}`,
      entry !== undefined ? { entry } : {},
    );

  /** Whether the end-of-archive marker was read (what follows is ignored). */
  get ended(): boolean {
    return this.state.kind === "end";
  }

  /** Feeds the next bytes of the archive. */
  async push(chunk: Buffer): Promise<void> {
    if (this.state.kind === "end") return;
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    while (await this.step());
  }

  /**
   * The archive's bytes are all there: refuses one that stops inside a member or after an
   * extended header. (One without its end-of-archive blocks is accepted: some writers omit them.)
   */
  finish(): void {
    const k = this.state.kind;
    if (k === "end") return;
    if (k !== "header" || this.buf.length > 0) throw this.bad("the archive is truncated");
    if (this.pending()) throw this.bad("the archive ends after an extended header");
  }

  private pending(): boolean {
    return this.longName !== null || this.longLink !== null || this.pax !== null;
  }

  private take(n: number): Buffer {
    const out = this.buf.subarray(0, n);
    this.buf = this.buf.subarray(n);
    return out;
  }

  /** One step of the state machine; false when it needs more bytes. */
  private async step(): Promise<boolean> {
    const s = this.state;
    switch (s.kind) {
      case "end":
        this.buf = Buffer.alloc(0);
        return false;
      case "header":
        if (this.buf.length < BLOCK) return false;
        await this.header(this.take(BLOCK));
        return true;
      case "meta": {
        if (s.left > 0) {
          if (this.buf.length === 0) return false;
          const part = this.take(Math.min(s.left, this.buf.length));
          s.parts.push(Buffer.from(part));
          s.left -= part.length;
          return true;
        }
        if (this.buf.length < s.pad) return false;
        this.take(s.pad);
        const body = Buffer.concat(s.parts);
        if (s.what === "longname") this.longName = cstring(body);
        else if (s.what === "longlink") this.longLink = cstring(body);
        else if (s.what === "pax") this.pax = parsePax(body, this.bad);
        else parsePax(body, this.bad); // global: checked, not used
        this.state = { kind: "header" };
        return true;
      }
      case "sparse-ext": {
        if (this.buf.length < BLOCK) return false;
        const b = this.take(BLOCK);
        sparseEntries(b, 21, s.map, this.bad);
        if (b[504] !== 0) return true; // another extension block follows
        checkSparseMap(s.map, s.entry.size, s.stored, s.entry.name, this.bad);
        this.startFile(s.map, s.stored);
        return true;
      }
      case "data": {
        while (s.seg < s.map.length && s.segLeft === 0) {
          s.seg++;
          const next = s.map[s.seg];
          if (next) {
            s.pos = next.offset;
            s.segLeft = next.length;
          }
        }
        if (s.seg >= s.map.length) {
          if (this.buf.length < s.pad) return false;
          this.take(s.pad);
          this.state = { kind: "header" };
          await this.sink.end();
          return true;
        }
        if (this.buf.length === 0) return false;
        const part = this.take(Math.min(s.segLeft, this.buf.length));
        const at = s.pos;
        s.pos += part.length;
        s.segLeft -= part.length;
        await this.sink.data(part, at);
        return true;
      }
    }
  }

  private num(field: Buffer, name: string): number {
    return parseNumber(field, (why) => this.bad(why, name));
  }

  private async header(h: Buffer): Promise<void> {
    const p = this.profile;
    if (h.every((x) => x === 0)) {
      if (this.pending()) throw this.bad("the archive ends after an extended header");
      this.state = { kind: "end" };
      return;
    }
    if (!checksumOk(h, this.bad))
      throw this.bad("a header's checksum is wrong (not a tar archive, or corrupt)");
    if (++this.headers > p.maxHeaders) throw this.bad(`more than ${p.maxHeaders} tar headers`);
    const magic = h.subarray(257, 265).toString("latin1");
    const gnu = magic === "ustar  \0";
    const ustar = magic.startsWith("ustar\0") || (!gnu && magic.startsWith("ustar "));
    if (!gnu && !magic.startsWith("ustar\0") && !p.v7) throw this.bad("not a ustar or GNU tar archive");
    const typeChar = String.fromCharCode(h[156] ?? 0);
    let name = cstring(h.subarray(0, 100));
    if (ustar) {
      const prefix = cstring(h.subarray(345, 500));
      if (prefix) name = `${prefix}/${name}`;
    }
    let size = this.num(h.subarray(124, 136), name);
    let linkname = cstring(h.subarray(157, 257));
    let uid = this.num(h.subarray(108, 116), name);
    let gid = this.num(h.subarray(116, 124), name);
    let mtime = this.num(h.subarray(136, 148), name);
    const mode = this.num(h.subarray(100, 108), name) & 0o7777;
    const xattrs = new Map<string, Buffer>();
    const pax = this.pax;
    if (this.longName !== null) name = this.longName;
    if (this.longLink !== null) linkname = this.longLink;
    if (pax) {
      const text = (k: string) => pax.get(k)?.toString("utf8");
      const int = (k: string, dflt: number) => {
        const v = text(k);
        if (v === undefined) return dflt;
        if (!/^\d{1,16}$/.test(v)) throw this.bad(`a bad pax ${k}`, name);
        return Number(v);
      };
      for (const k of pax.keys()) {
        if (k.startsWith("GNU.sparse.")) {
          throw this.bad(
            `pax sparse members are not supported${p.sparse ? " (write GNU sparse members: tar --sparse --format=gnu, as forkd pack does)" : ""}`,
            name,
          );
        }
      }
      name = text("path") ?? name;
      linkname = text("linkpath") ?? linkname;
      size = int("size", size);
      uid = int("uid", uid);
      gid = int("gid", gid);
      const mt = text("mtime");
      if (mt !== undefined) {
        if (!/^-?\d{1,16}(\.\d{1,9})?$/.test(mt)) throw this.bad("a bad pax mtime", name);
        mtime = Math.floor(Number(mt));
      }
      for (const [k, v] of pax) {
        if (k.startsWith("SCHILY.xattr.")) xattrs.set(k.slice("SCHILY.xattr.".length), v);
      }
    }
    this.longName = null;
    this.longLink = null;
    this.pax = null;
    const ext = EXTENDED[typeChar];
    if (ext && p.extended.includes(ext)) {
      if (size > p.maxExtended) throw this.bad(`an extended header larger than ${p.maxExtended} bytes`);
      this.state = { kind: "meta", what: ext, left: size, pad: padOf(size), parts: [] };
      return;
    }
    const sparse = typeChar === "S" && gnu && p.sparse;
    const type = sparse ? "file" : TYPES[typeChar];
    if (!type || !p.types.includes(type)) {
      throw this.bad(`tar entry type ${JSON.stringify(typeChar)} is not supported (${p.admits})`, name);
    }
    if (name.includes("\0") || linkname.includes("\0")) throw this.bad("a name holds a NUL byte", name);
    if (type !== "file" && size !== 0)
      throw this.bad(`a ${type === "dir" ? "directory" : type} entry with data`, name);
    const entry: TarEntry = {
      path: normalise(name),
      name,
      type,
      size,
      mode,
      uid,
      gid,
      mtime,
      linkname,
      xattrs,
    };
    if (!sparse) {
      await this.sink.entry(entry);
      if (type === "file") this.startFile([{ offset: 0, length: size }], size);
      return;
    }
    const realSize = this.num(h.subarray(483, 495), name);
    const map: Segment[] = [];
    sparseEntries(h.subarray(386, 482), 4, map, this.bad);
    // Admitted on its real size before the map (and so before any data) is read.
    entry.size = realSize;
    await this.sink.entry(entry);
    if (h[482] !== 0) {
      this.state = { kind: "sparse-ext", entry, stored: size, map };
      return;
    }
    checkSparseMap(map, realSize, size, name, this.bad);
    this.startFile(map, size);
  }

  private startFile(map: Segment[], stored: number): void {
    const first = map[0];
    this.state = {
      kind: "data",
      map,
      seg: 0,
      segLeft: first?.length ?? 0,
      pos: first?.offset ?? 0,
      pad: padOf(stored),
    };
  }
}
