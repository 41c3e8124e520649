/**
 * Names inside a layer, as the flatten uses them: the path components of an entry or a hard
 * link's target, with every way out of the root refused (a `..` component, an absolute hard
 * link target), and the whiteout names (`.wh.NAME`, the opaque marker `.wh..wh..opq`).
 */
import { ForkdError } from "../util/index.js";

export const WHITEOUT = ".wh.";
export const OPAQUE = ".wh..wh..opq";
/** A path component is at most this long (ext4's bound). */
const MAX_COMPONENT = 255;
const MAX_DEPTH = 256;

/**
 * "./a/b/", "/a/b", "a//b" → ["a","b"]; the root is []. Leading slashes of an entry's name are
 * dropped (the path is relative to the image's root either way); `..` is refused wherever it is.
 */
export function components(name: string, what: string, entry: string): string[] {
  const parts = name.split("/").filter((c) => c !== "" && c !== ".");
  for (const c of parts) {
    if (c === "..") {
      throw new ForkdError(
        "invalid_argument",
        `${what}: entry ${JSON.stringify(entry)}: a ".." component would leave the image's root`,
        { entry },
      );
    }
    if (Buffer.byteLength(c) > MAX_COMPONENT) {
      throw new ForkdError(
        "invalid_argument",
        `${what}: entry ${JSON.stringify(entry)}: a path component is longer than ${MAX_COMPONENT} bytes`,
        { entry },
      );
    }
  }
  if (parts.length > MAX_DEPTH) {
    throw new ForkdError(
      "invalid_argument",
      `${what}: entry ${JSON.stringify(entry)}: deeper than ${MAX_DEPTH} directories`,
      { entry },
    );
  }
  return parts;
}

/** A hard link's target: inside the layer's tree, never absolute. */
export function linkTarget(linkname: string, what: string, entry: string): string[] {
  if (linkname.startsWith("/")) {
    throw new ForkdError(
      "invalid_argument",
      `${what}: entry ${JSON.stringify(entry)}: hard link to an absolute path ${JSON.stringify(linkname.slice(0, 200))}`,
      { entry },
    );
  }
  const parts = components(linkname, what, entry);
  if (parts.length === 0) {
    throw new ForkdError(
      "invalid_argument",
      `${what}: entry ${JSON.stringify(entry)}: hard link to the root`,
      { entry },
    );
  }
  return parts;
}
