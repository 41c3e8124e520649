/**
 * The one byte range a peer asks of a file (`Range: bytes=N-`, `bytes=N-M`, `bytes=-N`): what a
 * pull resuming a file from byte N sends. Anything else (several ranges, another unit, a
 * malformed header) is ignored and the whole file is sent, as RFC 9110 lets a server do.
 */

/** Bytes `start`..`end` (inclusive) of the file. */
export interface ByteRange {
  start: number;
  end: number;
}

/**
 * The range `header` asks of a file of `size` bytes: null for the whole file (no usable
 * Range), "unsatisfiable" when it starts at or past the end (416), else the bytes to send.
 */
export function byteRange(header: string | undefined, size: number): ByteRange | "unsatisfiable" | null {
  const m = /^bytes=(\d{0,16})-(\d{0,16})$/.exec(header?.trim() ?? "");
  if (!m) return null;
  const [a, b] = [m[1] ?? "", m[2] ?? ""];
  if (a === "" && b === "") return null;
  if (a === "") {
    // The last N bytes.
    const n = Number(b);
    if (n === 0 || size === 0) return "unsatisfiable";
    return { start: Math.max(0, size - n), end: size - 1 };
  }
  const start = Number(a);
  const end = b === "" ? size - 1 : Math.min(Number(b), size - 1);
  if (b !== "" && Number(b) < start) return null; // invalid: ignored
  if (start >= size) return "unsatisfiable";
  return { start, end };
}
