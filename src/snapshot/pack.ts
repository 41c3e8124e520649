/**
 * Packs: a snapshot (with every ancestor of its chain and the guest image it needs) as one
 * zstd-compressed tar that restores on another host with nothing else.
 *
 *   manifest.json              {format, tag, chain (root first), image, files: {path: {size, sha256}}}
 *   image/                     vmlinuz, initrd.img, rootfs.ext4, manifest.json (the guest image)
 *   snapshots/<tag>/           meta.json, memory, vmstate, disk.qcow2 for every tag of the chain
 *                              (a diff snapshot: memory.diff instead of memory; its memory base
 *                              is an earlier snapshot of the chain, whose image the pack carries)
 *
 * manifest.json is the archive's first member, so an unpack (unpack.ts) bounds every other
 * file by the size it states. Registration (register.ts, for unpack and pull alike) checks
 * every file's size and sha256 before registering anything, installs the guest image under the
 * content address computed from its files (image/content.ts: never under the build hash the
 * pack claims, which only the image builder's own images answer to), rewrites the disk layers'
 * backing paths and the image path for this host, and publishes the chain root first; if any
 * step fails, what it published is removed again. The manifest's shape (checkChainShape) is
 * also a peer manifest's (peer-manifest.ts), which names the chain by store keys.
 *
 * A pack names its snapshots by their tags without namespace (src/snapshot/namespace.ts): a
 * tenant's `alice/app` is packed as `app` (its meta.json rewritten so), and registered in the
 * namespace of whoever unpacks it.
 */
import { spawn } from "node:child_process";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { pipeline } from "node:stream/promises";
import { z } from "zod";
import { IMAGE_FILES, imageAddress } from "../image/index.js";
import type { ImageFile } from "../image/index.js";
import { linkOrCopy } from "../util/index.js";
import { ForkdError } from "../util/index.js";
import { isValidTag } from "../util/index.js";
import { childEnv } from "../util/index.js";
import { sha256File, writeMeta } from "./meta.js";
import type { SnapshotMeta } from "./meta.js";
import type { SnapshotStore } from "./store.js";
import { listChain } from "./chain-files.js";
import { FileSums } from "./file-sums.js";
import type { CrashPoint } from "../util/index.js";
import { keyDir, splitKey } from "./namespace.js";
import type { Namespaces, Viewer } from "./namespace.js";
import type { ToolRunner } from "../vmm/index.js";

export const PACK_FORMAT = "forkd-pack/1";
const SNAPSHOT_FILES = ["meta.json", "memory", "memory.diff", "vmstate", "disk.qcow2"] as const;
/** Every snapshot of a pack has these, and exactly one of `memory` and `memory.diff`. */
const ALWAYS_FILES = ["meta.json", "vmstate", "disk.qcow2"] as const;
const MEMORY_FILES = ["memory", "memory.diff"] as const;
export const MAX_ENTRIES = 4096;
/** A pack manifest names at most 64 snapshots of 4 files and an image: far below this. */
const MAX_MANIFEST = 16 << 20;
/** A snapshot's meta.json (meta.ts reads at most 64 KiB) and an image's manifest.json. */
const MAX_META = 64 << 10;
const MAX_IMAGE_MANIFEST = 1 << 20;

/** The largest a file at `path` of a pack may be, whatever its manifest says. */
export function maxPackFileSize(path: string): number {
  if (path === "manifest.json") return MAX_MANIFEST;
  if (path === "image/manifest.json") return MAX_IMAGE_MANIFEST;
  if (path.endsWith("/meta.json")) return MAX_META;
  return Number.MAX_SAFE_INTEGER;
}

/**
 * Errors of unpack and pull as the API shows them: what a pack or the host did wrong is a
 * clear 4xx, never a raw exception (a full disk is resource_exhausted).
 */
export function mapPackError(e: unknown): unknown {
  if (e instanceof ForkdError) return e;
  const code = (e as NodeJS.ErrnoException | null)?.code;
  if (code === "ENOSPC" || code === "EDQUOT") {
    return new ForkdError("resource_exhausted", "no space left for the pack on this host", {}, e);
  }
  return e;
}

const FileSum = z.object({
  size: z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER),
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
});
export const PackManifestSchema = z.strictObject({
  format: z.literal(PACK_FORMAT),
  created: z.string(),
  tag: z.string(),
  chain: z.array(z.string()).min(1).max(64),
  image: z.object({
    hash: z.string().regex(/^[0-9a-f]{64}$/),
    template: z.string(),
    kernelVersion: z.string(),
  }),
  files: z.record(z.string(), FileSum),
});
export type PackManifest = z.infer<typeof PackManifestSchema>;
type Manifest = PackManifest;

/**
 * Lays out `tag`'s pack in `dir` (hard links, no copies where the filesystem allows) and
 * returns the manifest; the caller tars `dir`. The chain is named by its tags without namespace:
 * a snapshot whose key has one gets a meta.json rewritten with those names (and the checksums
 * they make). Its files and their sums are the chain's listing (chain-files.ts), which the peer
 * manifest reads too.
 */
export async function stagePack(
  store: SnapshotStore,
  tag: string,
  dir: string,
  sums: FileSums = new FileSums(),
): Promise<Manifest> {
  const { chain, image, own } = await listChain(store, tag, sums);
  const root = chain[0] as SnapshotMeta;
  const files: Manifest["files"] = {};
  const nameOf = (key: string) => splitKey(key).name;
  const names = new Set(chain.map((m) => nameOf(m.tag)));
  if (names.size !== chain.length)
    throw new ForkdError("conflict", `chain of ${tag} has two snapshots of one tag: compact it to pack it`, {
      tag,
    });
  await mkdir(join(dir, "image"), { recursive: true });
  for (const [f, h] of image) {
    await linkOrCopy(h.src, join(dir, "image", f));
    files[`image/${f}`] = { size: h.size, sha256: h.sha256 };
  }
  /** Each snapshot's metadata checksum in the pack (a rewritten parent's changes its children's). */
  const packed = new Map<string, string>();
  for (const [i, m] of chain.entries()) {
    const name = nameOf(m.tag);
    const d = join(dir, "snapshots", name);
    await mkdir(d, { recursive: true });
    for (const [f, h] of own[i] ?? []) {
      if (f === "meta.json") continue;
      await linkOrCopy(h.src, join(d, f));
      files[`snapshots/${name}/${f}`] = { size: h.size, sha256: h.sha256 };
    }
    const parentSum = m.parent ? (packed.get(m.parent.tag) ?? m.parent.checksum) : undefined;
    const meta = own[i]?.get("meta.json");
    if (
      meta &&
      name === m.tag &&
      parentSum === m.parent?.checksum &&
      nameOf(m.memoryBase?.tag ?? "") === (m.memoryBase?.tag ?? "")
    ) {
      await linkOrCopy(meta.src, join(d, "meta.json"));
      packed.set(m.tag, m.checksum);
      files[`snapshots/${name}/meta.json`] = { size: meta.size, sha256: meta.sha256 };
      continue;
    }
    const { checksum: _c, ...rest } = m;
    const written = await writeMeta(join(d, "meta.json"), {
      ...rest,
      tag: name,
      ...(m.parent && parentSum !== undefined
        ? { parent: { tag: nameOf(m.parent.tag), checksum: parentSum } }
        : {}),
      ...(m.memoryBase ? { memoryBase: { ...m.memoryBase, tag: nameOf(m.memoryBase.tag) } } : {}),
    });
    packed.set(m.tag, written.checksum);
    files[`snapshots/${name}/meta.json`] = await sha256File(join(d, "meta.json"));
  }
  const manifest: Manifest = {
    format: PACK_FORMAT,
    created: new Date().toISOString(),
    tag: nameOf(tag),
    chain: chain.map((m) => nameOf(m.tag)),
    image: { hash: root.image.hash, template: root.template, kernelVersion: root.image.kernelVersion },
    files,
  };
  await writeFile(join(dir, "manifest.json"), JSON.stringify(manifest, null, 2));
  return manifest;
}

/** Streams `tag`'s pack (tar + zstd) into `out`. */
export async function packSnapshot(
  store: SnapshotStore,
  tag: string,
  out: NodeJS.WritableStream,
  crash?: CrashPoint,
  sums?: FileSums,
): Promise<void> {
  const dir = store.stagingDir(`pack-${tag}-${Date.now().toString(36)}`);
  try {
    await stagePack(store, tag, dir, sums);
    // manifest.json first: an unpack bounds every later file by the size it states.
    const tar = spawn(
      "tar",
      ["--zstd", "--sparse", "-cf", "-", "-C", dir, "./manifest.json", "./image", "./snapshots"],
      {
        stdio: ["ignore", "pipe", "pipe"],
        env: childEnv(),
      },
    );
    let err = "";
    tar.on("error", (e) => (err ||= e.message)); // cannot start: its stdout closes, the code is not 0
    tar.stderr.on("data", (c: Buffer) => {
      if (err.length < 4096) err += c.toString();
    });
    const exited = new Promise<number | null>((r) => tar.once("close", r));
    try {
      crash?.("pack:streaming");
      // The reply ends only once tar said it succeeded: a pack cut by a failing tar is an error
      // to its reader, not a clean end of a short file.
      await pipeline(tar.stdout, out, { end: false });
      if ((await exited) !== 0) throw new ForkdError("internal", `tar failed: ${err.trim()}`);
      out.end();
    } finally {
      if (tar.exitCode === null && tar.signalCode === null) tar.kill("SIGKILL"); // its reader went away
      await exited;
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * Whether `p` (relative, "/"-separated, no "./") is where a pack may have a file (`dir` false)
 * or a directory (`dir` true). Every way into a staging directory (a tar listing, a registry
 * manifest) goes through this before anything is written.
 */
export function isPackPath(p: string, dir: boolean): boolean {
  const parts = p.split("/");
  if (p.startsWith("/") || parts.some((x) => x === ".." || x === "." || x === "")) return false;
  if (dir) {
    return (
      p === "image" ||
      p === "snapshots" ||
      (parts[0] === "snapshots" && parts.length === 2 && isValidTag(parts[1]))
    );
  }
  return (
    p === "manifest.json" ||
    (parts[0] === "image" &&
      parts.length === 2 &&
      (IMAGE_FILES as readonly string[]).includes(parts[1] ?? "")) ||
    (parts[0] === "snapshots" &&
      parts.length === 3 &&
      isValidTag(parts[1]) &&
      (SNAPSHOT_FILES as readonly string[]).includes(parts[2] ?? ""))
  );
}

export interface UnpackDeps {
  store: SnapshotStore;
  /** The cache directory: built images in images/, imported ones in imported/ (image/content.ts). */
  cacheDir: string;
  /** FORKD_UNPACK_MAX_MIB in bytes: what one unpack or pull may write (null/absent: free space). */
  maxBytes?: number | null;
  /** This host's accelerator: a snapshot restores only into the same kind of machine. */
  accel: "kvm" | "tcg";
  /**
   * Who unpacks (a tenant, or null: an admin) and the namespaces its tags are resolved in
   * (namespace.ts): each snapshot of the chain is the one it sees under its tag (reused if it
   * has the same content, else a conflict), or a new one in its namespace, owned by it. Absent:
   * an admin's tags as they are.
   */
  viewer?: Viewer;
  namespaces?: Namespaces;
  /** Test-only fault injection (src/util/crash.ts). */
  crash?: CrashPoint;
  /** Pins the image directory in the cache until the snapshots naming it are published. */
  pin?: (path: string) => Promise<boolean>;
  /** Runs qemu-img on the pack's layers (a tenant wrote them), jailed (src/vmm/jailed-tools.ts). */
  tools: ToolRunner;
}

/** What registering a staged pack did. */
export interface Registered {
  tag: string;
  /** Tags registered now, root first (a shared base already here is not). */
  published: string[];
}

/** A fresh staging directory name for an unpack or a pull. */
export const stagingName = (what: string): string =>
  `${what}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;

/** "a.b: message" for the first problem zod found. */
export function firstIssue(e: z.ZodError): { field: string; message: string } {
  const i = e.issues[0];
  return { field: i?.path.join(".") || "(root)", message: i?.message ?? "invalid" };
}

/** A manifest's JSON, parsed with `schema` (at most 16 MiB): a clear 400 naming the bad field. */
export function parseManifestJson<T>(raw: string, schema: z.ZodType<T>, what: string): T {
  if (raw.length > MAX_MANIFEST) throw new ForkdError("invalid_argument", `${what} is too large`);
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw new ForkdError("invalid_argument", `${what} is missing or not JSON`);
  }
  const r = schema.safeParse(json);
  if (!r.success) {
    const { field, message } = firstIssue(r.error);
    throw new ForkdError("invalid_argument", `${what} is invalid: ${field}: ${message}`, { field });
  }
  return r.data;
}

/**
 * Checks a chain manifest's shape: a chain of distinct names (`valid`: a pack's tags, a peer's
 * store keys) ending at its tag, and exactly the files such a chain has (the image's four, four
 * per snapshot under `snapshots/<its directory name>/`), none larger than its kind may be.
 */
export function checkChainShape(
  m: { tag: string; chain: string[]; files: Record<string, { size: number }> },
  valid: (name: string) => boolean,
  what: string,
): void {
  const bad = (why: string, details: Record<string, unknown> = {}) =>
    new ForkdError("invalid_argument", `${what}: ${why}`, details);
  const tags = new Set<string>();
  for (const t of m.chain) {
    if (!valid(t)) throw bad(`bad tag in its chain: ${JSON.stringify(t)}`, { field: "chain" });
    if (tags.has(t)) throw bad(`tag ${t} twice in its chain`, { field: "chain" });
    tags.add(t);
  }
  if (m.chain[m.chain.length - 1] !== m.tag) throw bad("chain does not end at its tag", { field: "tag" });
  const want = new Set<string>(IMAGE_FILES.map((f) => `image/${f}`));
  for (const t of m.chain) for (const f of ALWAYS_FILES) want.add(`${stagedDir(t)}/${f}`);
  // Each snapshot's memory: a full image or a diff (the root's is a full image).
  for (const [i, t] of m.chain.entries()) {
    const has = MEMORY_FILES.filter((f) => `${stagedDir(t)}/${f}` in m.files);
    if (has.length !== 1 || (i === 0 && has[0] !== "memory"))
      throw bad(`snapshot ${t} needs exactly one of memory and memory.diff (the first one: memory)`, {
        field: "files",
      });
    want.add(`${stagedDir(t)}/${has[0]}`);
  }
  for (const [f, sum] of Object.entries(m.files)) {
    if (!want.has(f)) {
      throw bad(`lists an unexpected path: ${JSON.stringify(f)}`, { field: "files", file: f });
    }
    if (sum.size > maxPackFileSize(f)) throw bad(`${f} is too large (${sum.size} bytes)`, { file: f });
  }
  for (const f of want) {
    if (!(f in m.files)) throw bad(`does not list ${f}`, { field: "files", file: f });
  }
}

/**
 * Where a chain's snapshot `name` is staged, relative to the staging directory: a pack's tag
 * as it is (`snapshots/py`), a store key as its directory is named (`snapshots/alice~app`).
 */
export const stagedDir = (name: string): string => `snapshots/${keyDir(name)}`;

/**
 * Reads and validates a pack's manifest.json (at most 16 MiB): its schema, and its shape: a
 * chain of distinct valid tags ending at its tag, and exactly the files such a pack has (the
 * image's four, four per snapshot of the chain), none larger than its kind may be.
 */
export function parsePackManifest(raw: string): PackManifest {
  const m = parseManifestJson(raw, PackManifestSchema, "pack manifest");
  checkChainShape(m, isValidTag, "pack manifest");
  return m;
}

/** The image's file sums a pack manifest lists (parsePackManifest checked they are all there). */
function imageSums(m: Pick<PackManifest, "files">): Record<ImageFile, { size: number; sha256: string }> {
  const get = (f: ImageFile) => {
    const s = m.files[`image/${f}`];
    if (!s) throw new ForkdError("invalid_argument", `pack manifest: does not list image/${f}`);
    return s;
  };
  return {
    vmlinuz: get("vmlinuz"),
    "initrd.img": get("initrd.img"),
    "rootfs.ext4": get("rootfs.ext4"),
    "manifest.json": get("manifest.json"),
  };
}

/** The content address of a pack's guest image: from the sums its files are verified against. */
export const packImageAddress = (m: Pick<PackManifest, "files">): string => imageAddress(imageSums(m));
