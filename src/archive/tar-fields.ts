/**
 * The arithmetic of tar headers, for the tar reader (tar-reader.ts): numeric fields (octal or
 * GNU base-256), the header checksum, NUL-terminated strings, pax records, GNU sparse maps, and
 * the path rule every reader of an untrusted archive applies. Every function throws through the
 * `bad` it is given (so its message names the archive), never a bare Error.
 */
import type { ForkdError } from "../util/index.js";

/** The kinds of tar member a profile may allow. */
export type TarEntryType = "file" | "dir" | "symlink" | "hardlink" | "char" | "block" | "fifo";

export const BLOCK = 512;

/** Builds the error of a malformed archive: `why`, about `entry` where one is known. */
export type Bad = (why: string, entry?: string) => ForkdError;

/** A numeric header field: octal text (NUL/space terminated) or GNU base-256. */
export function parseNumber(field: Buffer, bad: Bad): number {
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

export const cstring = (b: Buffer): string => {
  const end = b.indexOf(0);
  return b.subarray(0, end < 0 ? b.length : end).toString("utf8");
};

/** Whether the header's checksum (bytes summed, the checksum field as spaces) is right. */
export function checksumOk(h: Buffer, bad: Bad): boolean {
  let stored: number;
  try {
    stored = parseNumber(h.subarray(148, 156), bad);
  } catch {
    return false;
  }
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

/**
 * Whether a normalised path stays inside the directory it is unpacked into: relative, and no
 * `..`, `.` or empty component ("" itself is the root).
 */
export const staysInside = (path: string): boolean =>
  path === "" || (!path.startsWith("/") && path.split("/").every((x) => x !== ".." && x !== "." && x !== ""));

/**
 * Pax records ("<len> key=value\n", the length at most 20 digits and covering the newline),
 * values kept as bytes (xattrs are binary); NUL padding after the last record ends them.
 */
export function parsePax(b: Buffer, bad: Bad): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  let at = 0;
  while (at < b.length) {
    if (b[at] === 0) break;
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

/** Sparse map entries a member may have (a 512 MiB RAM image has a few thousand). */
export const MAX_SPARSE_ENTRIES = 1 << 18;

export interface Segment {
  offset: number;
  length: number;
}

/** Reads `count` sparse map entries (24 bytes each) from `b`; stops at an empty one. */
export function sparseEntries(b: Buffer, count: number, into: Segment[], bad: Bad): void {
  for (let i = 0; i < count; i++) {
    const e = b.subarray(i * 24, i * 24 + 24);
    if (e.every((x) => x === 0)) return;
    into.push({ offset: parseNumber(e.subarray(0, 12), bad), length: parseNumber(e.subarray(12, 24), bad) });
    if (into.length > MAX_SPARSE_ENTRIES) throw bad("a sparse member with too many regions");
  }
}

/** Checks a sparse map: ordered, not overlapping, within the real size, adding up to the stored size. */
export function checkSparseMap(
  map: Segment[],
  realSize: number,
  stored: number,
  name: string,
  bad: Bad,
): void {
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
