/**
 * What each kind of archive may hold, for the tar reader (tar-reader.ts). Every bound one of
 * forkd's two earlier readers had is kept: a pack or a build context holds files and
 * directories only, ustar or GNU, extended headers up to 64 KiB, 65,536 headers; an image layer
 * may hold every type of node a root filesystem has, old v7 headers, and pax headers up to 1 MiB
 * (xattr values reach 64 KiB each), its headers bounded by the image's entry bound (flatten.ts)
 * with room for each entry's extended headers.
 */
import type { TarEntryType } from "./tar-fields.js";

export interface TarProfile {
  /** Names the archive in messages: "<label>: why", "<label>: entry "x": why". */
  label: string;
  /** Entry types admitted; any other is refused before its data is read. */
  types: readonly TarEntryType[];
  /** What the types are, for the refusal's message. */
  admits: string;
  /** GNU sparse members (`S`), read as files with holes. */
  sparse: boolean;
  /** Extended headers read: GNU long names and link names, pax per-entry and global. */
  extended: readonly ("longname" | "longlink" | "pax" | "global")[];
  /** Headers without the ustar magic (v7 tar) are read. */
  v7: boolean;
  /** Bytes of one extended header. */
  maxExtended: number;
  /** Headers in the archive, extended ones included. */
  maxHeaders: number;
}

/** A forkd pack (src/snapshot/pack.ts): what GNU tar writes for one. */
export const PACK_TAR: TarProfile = {
  label: "not a readable pack",
  types: ["file", "dir"],
  admits: "not a plain file or directory",
  sparse: true,
  extended: ["longname", "pax"],
  v7: false,
  maxExtended: 64 << 10,
  maxHeaders: 1 << 16,
};

/** A Dockerfile build context sent as a tar stream: what a pack may hold, in its own words. */
export const CONTEXT_TAR: TarProfile = { ...PACK_TAR, label: "build context: not a readable tar" };

/** An OCI image layer, named in messages by `what` ("layer 2/5 sha256:…"), `maxEntries` its image's bound. */
export const layerTar = (what: string, maxEntries = 1_000_000): TarProfile => ({
  label: what,
  types: ["file", "dir", "symlink", "hardlink", "char", "block", "fifo"],
  admits: "a layer holds files, directories, links, devices and FIFOs",
  sparse: false,
  extended: ["longname", "longlink", "pax", "global"],
  v7: true,
  maxExtended: 1 << 20,
  maxHeaders: 4 * maxEntries + 1024,
});
