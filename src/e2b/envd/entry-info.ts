/**
 * E2B's EntryInfo of paths in the guest (name, type, path, size, mode, permissions, owner,
 * group, modified time, symlink target), read in one go by GNU find's -printf run as the
 * request's user: what the guest agent's STAT and LIST do not say (owner and group names, link
 * targets), at any depth, and with that user's permissions (a directory it cannot read is
 * refused as under E2B's envd).
 */
import { posix } from "node:path";
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { AgentClient } from "../../agent/index.js";
import { ForkdError } from "../../util/index.js";
import { helperExec } from "./helper-env.js";
import { EntryInfoSchema, FileType } from "./gen/filesystem/filesystem_pb.js";
import type { EntryInfo } from "./gen/filesystem/filesystem_pb.js";

/** Fields per entry: type, size, mode bits, owner, group, mtime, link target, path, depth. */
const FORMAT = "%y\\0%s\\0%m\\0%u\\0%g\\0%T@\\0%l\\0%p\\0%d\\0";
const FIELDS = 9;
/**
 * find's output is refused past these (a runaway depth on a huge tree, or a hostile guest's
 * find): one entry is at most two 4096-byte paths and a few numbers, a listing is bounded.
 */
export const MAX_STAT_OUTPUT = 16 << 10;
export const MAX_LIST_OUTPUT = 16 << 20;
const TIMEOUT_MS = 60_000;

const TYPE_CHAR: Record<string, string> = { d: "d", l: "L", f: "-", p: "p", s: "S", b: "D", c: "c" };

/** Go's FileMode.String() of a type and permission bits, as E2B's envd reports `permissions`. */
export function permissionString(type: string, mode: number): string {
  const rwx = "rwxrwxrwx";
  let s = TYPE_CHAR[type] ?? "?";
  for (let i = 0; i < 9; i++) s += mode & (1 << (8 - i)) ? rwx[i] : "-";
  return s;
}

function fileType(c: string): FileType {
  if (c === "d") return FileType.DIRECTORY;
  if (c === "l") return FileType.SYMLINK;
  if (c === "f") return FileType.FILE;
  return FileType.UNSPECIFIED;
}

/** One entry found: its EntryInfo, its depth under the path asked, find's type letter. */
export interface Found {
  entry: EntryInfo;
  depth: number;
  typeChar: string;
}

/** One entry of find's output. */
function entryOf(f: string[]): Found {
  const [
    type = "",
    size = "0",
    mode = "0",
    owner = "",
    group = "",
    mtime = "0",
    link = "",
    path = "",
    depth = "0",
  ] = f;
  const bits = parseInt(mode, 8) & 0o7777;
  const e = create(EntryInfoSchema, {
    name: posix.basename(path) || path,
    type: fileType(type),
    path,
    size: BigInt(size.replace(/[^0-9]/g, "") || "0"),
    mode: bits,
    permissions: permissionString(type, bits),
    owner,
    group,
    modifiedTime: timestampFromMs(Math.floor(Number(mtime) * 1000) || 0),
    ...(type === "l" ? { symlinkTarget: link } : {}),
  });
  return { entry: e, depth: Number(depth), typeChar: type };
}

/** What find's complaint about the top path means. */
function findError(path: string, stderr: string): ForkdError {
  if (/No such file or directory/.test(stderr))
    return new ForkdError("not_found", `path not found: ${path}`, { errno_name: "ENOENT" });
  if (/Permission denied/.test(stderr))
    return new ForkdError("forbidden", `permission denied: ${path}`, { errno_name: "EACCES" });
  if (/Not a directory/.test(stderr)) return new ForkdError("invalid_argument", `not a directory: ${path}`);
  return new ForkdError(
    "guest_error",
    `cannot stat ${path}: ${stderr.trim().slice(0, 500) || "find failed"}`,
  );
}

/**
 * `path` and its entries down to `depth` (0: only itself), as `user` sees them. The first
 * entry is `path` itself; a path that cannot be stat-ed is an error.
 */
export async function findEntries(
  agent: AgentClient,
  user: string,
  path: string,
  depth: number,
  prefix: string[] = [],
): Promise<Found[]> {
  const max = depth === 0 ? MAX_STAT_OUTPUT : MAX_LIST_OUTPUT;
  const out: Buffer[] = [];
  let size = 0;
  const err: Buffer[] = [];
  let errSize = 0;
  const script = `${prefix.join(" ")}${prefix.length ? " && " : ""}exec find "$1" -maxdepth "$2" -printf '${FORMAT}'`;
  const h = agent.exec(
    helperExec({ argv: ["/bin/sh", "-c", script, "sh", path, String(depth)], user, timeoutMs: TIMEOUT_MS }),
    {
      onStdout: (d) => {
        size += d.length;
        if (size > max) return size - d.length <= max ? h.signal(9) : undefined;
        out.push(Buffer.from(d));
      },
      onStderr: (d) => {
        errSize += d.length;
        if (errSize <= 64 << 10) err.push(Buffer.from(d));
      },
    },
  );
  await h.result;
  if (size > max)
    throw new ForkdError(
      "resource_exhausted",
      depth === 0
        ? `the guest's answer about ${path} is larger than ${max} bytes`
        : `listing ${path} is larger than ${max} bytes: ask less depth`,
    );
  const fields = Buffer.concat(out).toString("utf8").split("\0");
  const entries: Found[] = [];
  for (let i = 0; i + FIELDS <= fields.length; i += FIELDS)
    entries.push(entryOf(fields.slice(i, i + FIELDS)));
  const first = entries[0];
  if (!first || first.depth !== 0) throw findError(path, Buffer.concat(err).toString("utf8"));
  return entries;
}

/** The EntryInfo of one path (not following a symlink), as `user` sees it. */
export async function statEntry(agent: AgentClient, user: string, path: string): Promise<EntryInfo> {
  const [f] = await findEntries(agent, user, path, 0);
  return f!.entry;
}
