/**
 * A streaming tar reader for image layers: ustar, GNU (long names and link names) and pax
 * (path, linkpath, size, uid, gid, mtime, `SCHILY.xattr.*`), every entry type a layer may hold
 * (files, directories, symlinks, hard links, devices and FIFOs: the sink decides what it
 * admits). GNU sparse members and unknown types are refused, naming the entry. A member's
 * data reaches the sink in order, never beyond the size its header states, after the sink
 * admitted the header. (src/snapshot/tar-reader.ts is the pack reader: files and directories
 * only, its messages about packs; this one shares its header arithmetic.)
 */
import { checksumOk, parseNumber } from "../snapshot/tar-reader.js";
import { ForkdError } from "../util/errors.js";

const BLOCK = 512;
/** A GNU long name or a pax header is at most this large. */
const MAX_META_ENTRY = 1 << 20;

export type LayerEntryType = "file" | "dir" | "symlink" | "hardlink" | "char" | "block" | "fifo";

export interface LayerEntry {
  /** The name as the archive spells it (pax and GNU long names applied). */
  name: string;
  type: LayerEntryType;
  size: number;
  /** Permission bits with setuid/setgid/sticky (0o7777). */
  mode: number;
  uid: number;
  gid: number;
  /** Seconds since the epoch. */
  mtime: number;
  /** Symlink target, or the hard link's target path in the layer. */
  linkname: string;
  /** From pax `SCHILY.xattr.NAME` records: NAME → value bytes. */
  xattrs: Map<string, Buffer>;
}

export interface LayerSink {
  /** An entry's header, before any of its data; throws to refuse it. */
  entry(e: LayerEntry): Promise<void>;
  /** The next bytes of the current file. */
  data(chunk: Buffer): Promise<void>;
  /** The current file is complete. */
  end(): Promise<void>;
}

const TYPES: Record<string, LayerEntryType> = {
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

const cstring = (b: Buffer): string => {
  const end = b.indexOf(0);
  return b.subarray(0, end < 0 ? b.length : end).toString("utf8");
};

/** Pax records ("<len> key=value\n"), values kept as bytes (xattrs are binary). */
export function parsePaxRecords(b: Buffer, bad: (why: string) => ForkdError): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  let at = 0;
  while (at < b.length) {
    if (b[at] === 0) break; // NUL padding after the records
    const sp = b.indexOf(0x20, at);
    if (sp < 0 || sp - at > 20) throw bad("a bad pax record");
    const len = Number(b.subarray(at, sp).toString("latin1"));
    if (!Number.isSafeInteger(len) || len <= sp - at + 1 || at + len > b.length || b[at + len - 1] !== 0x0a) {
      throw bad("a bad pax record");
    }
    const rec = b.subarray(sp + 1, at + len - 1);
    const eq = rec.indexOf(0x3d);
    if (eq < 0) throw bad("a bad pax record");
    out.set(rec.subarray(0, eq).toString("utf8"), Buffer.from(rec.subarray(eq + 1)));
    at += len;
  }
  return out;
}

type State =
  | { kind: "header" }
  | {
      kind: "meta";
      what: "longname" | "longlink" | "pax" | "global";
      left: number;
      pad: number;
      parts: Buffer[];
    }
  | { kind: "data"; left: number; pad: number }
  | { kind: "end" };

export class LayerReader {
  private buf: Buffer = Buffer.alloc(0);
  private state: State = { kind: "header" };
  private longName: string | null = null;
  private longLink: string | null = null;
  private pax: Map<string, Buffer> | null = null;

  /** `what` names the layer in messages ("layer 2/5 sha256:…"). */
  constructor(
    private readonly sink: LayerSink,
    private readonly what: string,
  ) {}

  private bad = (why: string, entry?: string): ForkdError =>
    new ForkdError(
      "invalid_argument",
      `${this.what}: ${entry !== undefined ? `entry ${JSON.stringify(entry)}: ` : ""}${why}`,
      {
        ...(entry !== undefined ? { entry } : {}),
      },
    );

  get ended(): boolean {
    return this.state.kind === "end";
  }

  async push(chunk: Buffer): Promise<void> {
    if (this.state.kind === "end") return;
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    while (await this.step());
  }

  /** The layer's bytes are all there: refuses one that stops inside a member. */
  finish(): void {
    const k = this.state.kind;
    if (k === "end") return;
    if (k !== "header" || this.buf.length > 0) throw this.bad("the layer's tar is truncated");
    // A tar that ends without its end-of-archive blocks is accepted (some writers omit them).
    if (this.longName !== null || this.longLink !== null || this.pax !== null) {
      throw this.bad("the layer ends after an extended header");
    }
  }

  private take(n: number): Buffer {
    const out = this.buf.subarray(0, n);
    this.buf = this.buf.subarray(n);
    return out;
  }

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
        else if (s.what === "pax") this.pax = parsePaxRecords(body, (w) => this.bad(w));
        else parsePaxRecords(body, (w) => this.bad(w)); // global: checked, not used
        this.state = { kind: "header" };
        return true;
      }
      case "data": {
        if (s.left > 0) {
          if (this.buf.length === 0) return false;
          const part = this.take(Math.min(s.left, this.buf.length));
          s.left -= part.length;
          await this.sink.data(part);
          return true;
        }
        if (this.buf.length < s.pad) return false;
        this.take(s.pad);
        this.state = { kind: "header" };
        await this.sink.end();
        return true;
      }
    }
  }

  private num(field: Buffer, name: string): number {
    try {
      return parseNumber(field);
    } catch {
      throw this.bad("a header field is not a number", name);
    }
  }

  private async header(h: Buffer): Promise<void> {
    if (h.every((x) => x === 0)) {
      if (this.longName !== null || this.longLink !== null || this.pax !== null) {
        throw this.bad("the layer ends after an extended header");
      }
      this.state = { kind: "end" };
      return;
    }
    let sumOk = false;
    try {
      sumOk = checksumOk(h);
    } catch {
      sumOk = false;
    }
    if (!sumOk) throw this.bad("a tar header's checksum is wrong (not a tar archive, or corrupt)");
    const magic = h.subarray(257, 265).toString("latin1");
    const gnu = magic === "ustar  \0";
    const ustar = magic.startsWith("ustar\0") || magic.startsWith("ustar ");
    const typeChar = String.fromCharCode(h[156] ?? 0);
    let name = cstring(h.subarray(0, 100));
    if (ustar && !gnu) {
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
        if (k.startsWith("GNU.sparse.")) throw this.bad("sparse members are not supported in layers", name);
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
    if (typeChar === "L" || typeChar === "K" || typeChar === "x" || typeChar === "g") {
      if (size > MAX_META_ENTRY) throw this.bad("an extended header is too large");
      this.state = {
        kind: "meta",
        what:
          typeChar === "L" ? "longname" : typeChar === "K" ? "longlink" : typeChar === "x" ? "pax" : "global",
        left: size,
        pad: (BLOCK - (size % BLOCK)) % BLOCK,
        parts: [],
      };
      return;
    }
    const type = TYPES[typeChar];
    if (!type) {
      throw this.bad(`tar entry type ${JSON.stringify(typeChar)} is not supported in a layer`, name);
    }
    if (name.includes("\0") || linkname.includes("\0")) throw this.bad("a name holds a NUL byte", name);
    if (type !== "file" && size !== 0) throw this.bad(`a ${type} entry with data`, name);
    await this.sink.entry({ name, type, size, mode, uid, gid, mtime, linkname, xattrs });
    if (type === "file") this.state = { kind: "data", left: size, pad: (BLOCK - (size % BLOCK)) % BLOCK };
  }
}
