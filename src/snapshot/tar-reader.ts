/**
 * A streaming tar reader for packs: one pass over the decompressed bytes, no temporary copy of
 * the archive. It understands what GNU tar writes for a pack (ustar and GNU headers, GNU long
 * names, old-GNU sparse members `S` with their extension blocks, pax `path`/`size` records) and
 * refuses every other entry type before any of its data is read. Each member's data reaches the
 * sink at its offset in the file (a sparse member's holes are never materialised here), in
 * order, never beyond the size its header states, and after the sink admitted the header: the
 * sink bounds what may be written before the first byte is.
 */
import { ForkdError } from "../util/errors.js";

const BLOCK = 512;
/** A GNU long name or a pax header is at most this large. */
const MAX_META_ENTRY = 64 << 10;
/** Sparse map entries a member may have (a 512 MiB RAM image has a few thousand). */
export const MAX_SPARSE_ENTRIES = 1 << 18;
/** Headers an archive may have, extended ones included (a pack has a few hundred members). */
const MAX_HEADERS = 1 << 16;

export interface TarEntry {
  /** Normalised: no leading "./", no trailing "/"; "" for the archive's root. */
  path: string;
  /** The name as the archive spells it (for messages). */
  name: string;
  type: "file" | "dir";
  /** The file's size (a sparse member: its real size, holes included). */
  size: number;
  /** Permission bits of the header (mode & 0o7777). */
  mode?: number;
}

export interface TarSink {
  /** A member's header, before any of its data; throws to refuse it. */
  entry(e: TarEntry): Promise<void>;
  /** `chunk` of the current file at `offset` (increasing, never past its size). */
  data(chunk: Buffer, offset: number): Promise<void>;
  /** The current file is complete. */
  end(): Promise<void>;
}

const bad = (why: string, details: Record<string, unknown> = {}) =>
  new ForkdError("invalid_argument", `not a readable pack: ${why}`, details);

/** A numeric header field: octal text (NUL/space terminated) or GNU base-256. */
export function parseNumber(field: Buffer): number {
  if (field.length > 0 && ((field[0] ?? 0) & 0x80) !== 0) {
    if (((field[0] ?? 0) & 0x40) !== 0) throw bad("a negative number in a header");
    let n = (field[0] ?? 0) & 0x3f;
    for (let i = 1; i < field.length; i++) {
      n = n * 256 + (field[i] ?? 0);
      if (n > Number.MAX_SAFE_INTEGER) throw bad("a number too large in a header");
    }
    return n;
  }
  const text = field
    .toString("latin1")
    .replace(/[\0 ]+$/, "")
    .replace(/^ +/, "");
  if (text === "") return 0;
  if (!/^[0-7]+$/.test(text)) throw bad(`a header field is not a number: ${JSON.stringify(text)}`);
  const n = parseInt(text, 8);
  if (!Number.isSafeInteger(n)) throw bad("a number too large in a header");
  return n;
}

const cstring = (b: Buffer): string => {
  const end = b.indexOf(0);
  return b.subarray(0, end < 0 ? b.length : end).toString("utf8");
};

/** Whether the header's checksum (bytes summed, the checksum field as spaces) is right. */
export function checksumOk(h: Buffer): boolean {
  const stored = parseNumber(h.subarray(148, 156));
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < BLOCK; i++) {
    const b = i >= 148 && i < 156 ? 0x20 : (h[i] ?? 0);
    unsigned += b;
    signed += b > 127 ? b - 256 : b;
  }
  return stored === unsigned || stored === signed;
}

/** "./a/b/" → "a/b"; "." and "./" → "". */
export const normalise = (name: string): string =>
  name
    .replace(/^(\.\/)+/, "")
    .replace(/\/+$/, "")
    .replace(/^\.$/, "");

/** Parses pax extended header records ("<len> key=value\n"). */
export function parsePax(b: Buffer): Map<string, string> {
  const out = new Map<string, string>();
  let at = 0;
  while (at < b.length) {
    const sp = b.indexOf(0x20, at);
    if (sp < 0) break;
    const len = Number(b.subarray(at, sp).toString("latin1"));
    if (!Number.isSafeInteger(len) || len <= sp - at || at + len > b.length) throw bad("a bad pax record");
    const rec = b.subarray(sp + 1, at + len - 1).toString("utf8");
    const eq = rec.indexOf("=");
    if (eq < 0) throw bad("a bad pax record");
    out.set(rec.slice(0, eq), rec.slice(eq + 1));
    at += len;
  }
  return out;
}

interface Segment {
  offset: number;
  length: number;
}

/** Reads `count` sparse map entries (24 bytes each) from `b`; stops at an empty one. */
function sparseEntries(b: Buffer, count: number, into: Segment[]): void {
  for (let i = 0; i < count; i++) {
    const e = b.subarray(i * 24, i * 24 + 24);
    if (e.every((x) => x === 0)) return;
    into.push({ offset: parseNumber(e.subarray(0, 12)), length: parseNumber(e.subarray(12, 24)) });
    if (into.length > MAX_SPARSE_ENTRIES) throw bad("a sparse member with too many regions");
  }
}

/** Checks a sparse map: ordered, not overlapping, within the real size, adding up to the stored size. */
export function checkSparseMap(map: Segment[], realSize: number, stored: number, name: string): void {
  let end = 0;
  let sum = 0;
  for (const s of map) {
    if (s.offset < end || s.offset + s.length > realSize) {
      throw bad(`sparse member ${JSON.stringify(name)} has a region out of order or past its size`);
    }
    end = s.offset + s.length;
    sum += s.length;
  }
  if (sum !== stored) throw bad(`sparse member ${JSON.stringify(name)}: its map does not add up to its data`);
}

type State =
  | { kind: "header" }
  | { kind: "meta"; what: "longname" | "pax"; left: number; pad: number; parts: Buffer[] }
  | { kind: "sparse-ext"; entry: TarEntry; stored: number; map: Segment[] }
  | { kind: "data"; map: Segment[]; seg: number; segLeft: number; pos: number; pad: number }
  | { kind: "end" };

export class TarReader {
  private buf: Buffer = Buffer.alloc(0);
  private state: State = { kind: "header" };
  private longName: string | null = null;
  private pax: Map<string, string> | null = null;
  private headers = 0;

  constructor(private readonly sink: TarSink) {}

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

  /** The archive's bytes are all there: refuses one that stops inside a member. */
  finish(): void {
    const k = this.state.kind;
    if (k === "end") return;
    if (k !== "header" || this.buf.length > 0) throw bad("the archive is truncated");
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
        else this.pax = parsePax(body);
        this.state = { kind: "header" };
        return true;
      }
      case "sparse-ext": {
        if (this.buf.length < BLOCK) return false;
        const b = this.take(BLOCK);
        sparseEntries(b, 21, s.map);
        if (b[504] !== 0) return true; // another extension block follows
        checkSparseMap(s.map, s.entry.size, s.stored, s.entry.name);
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

  private async header(h: Buffer): Promise<void> {
    if (h.every((x) => x === 0)) {
      if (this.longName !== null || this.pax !== null) throw bad("the archive ends after an extended header");
      this.state = { kind: "end" };
      return;
    }
    if (!checksumOk(h)) throw bad("a header's checksum is wrong (not a tar archive, or corrupt)");
    if (++this.headers > MAX_HEADERS) throw bad("too many entries");
    const magic = h.subarray(257, 265).toString("latin1");
    const gnu = magic === "ustar  \0";
    if (!gnu && !magic.startsWith("ustar\0")) throw bad("not a ustar or GNU tar archive");
    const type = String.fromCharCode(h[156] ?? 0);
    let name = cstring(h.subarray(0, 100));
    if (!gnu) {
      const prefix = cstring(h.subarray(345, 500));
      if (prefix) name = `${prefix}/${name}`;
    }
    let size = parseNumber(h.subarray(124, 136));
    const pax = this.pax;
    if (this.longName !== null) name = this.longName;
    if (pax) {
      for (const k of pax.keys()) {
        if (k.startsWith("GNU.sparse.")) {
          throw bad("pax sparse members are not supported (pack with GNU tar --sparse, as forkd pack does)");
        }
      }
      const p = pax.get("path");
      if (p !== undefined) name = p;
      const sz = pax.get("size");
      if (sz !== undefined) {
        if (!/^\d{1,16}$/.test(sz)) throw bad("a bad pax size");
        size = Number(sz);
      }
    }
    this.longName = null;
    this.pax = null;
    if (type === "L" || type === "x") {
      if (size > MAX_META_ENTRY) throw bad("an extended header too large");
      this.state = {
        kind: "meta",
        what: type === "L" ? "longname" : "pax",
        left: size,
        pad: (BLOCK - (size % BLOCK)) % BLOCK,
        parts: [],
      };
      return;
    }
    const path = normalise(name);
    const mode = parseNumber(h.subarray(100, 108)) & 0o7777;
    if (type === "5") {
      if (size !== 0) throw bad(`directory ${JSON.stringify(name)} has data`);
      await this.sink.entry({ path, name, type: "dir", size: 0, mode });
      return;
    }
    if (type === "0" || type === "\0" || type === "7") {
      const entry: TarEntry = { path, name, type: "file", size, mode };
      await this.sink.entry(entry);
      this.startFile([{ offset: 0, length: size }], size);
      return;
    }
    if (type === "S" && gnu) {
      const realSize = parseNumber(h.subarray(483, 495));
      const map: Segment[] = [];
      sparseEntries(h.subarray(386, 482), 4, map);
      const entry: TarEntry = { path, name, type: "file", size: realSize };
      // Admitted on its real size before the map (and so before any data) is read.
      await this.sink.entry(entry);
      if (h[482] !== 0) {
        this.state = { kind: "sparse-ext", entry, stored: size, map };
        return;
      }
      checkSparseMap(map, realSize, size, name);
      this.startFile(map, size);
      return;
    }
    throw new ForkdError(
      "invalid_argument",
      `pack entry ${JSON.stringify(name)} is not a plain file or directory`,
      { entry: name },
    );
  }

  private startFile(map: Segment[], stored: number): void {
    const first = map[0];
    this.state = {
      kind: "data",
      map,
      seg: 0,
      segLeft: first?.length ?? 0,
      pos: first?.offset ?? 0,
      pad: (BLOCK - (stored % BLOCK)) % BLOCK,
    };
  }
}
