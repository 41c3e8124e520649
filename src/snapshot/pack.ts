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
 * file by the size it states. Registration (registerStaged, for unpack and pull alike) checks
 * every file's size and sha256 before registering anything, installs the guest image under the
 * content address computed from its files (image/content.ts: never under the build hash the
 * pack claims, which only the image builder's own images answer to), rewrites the disk layers'
 * backing paths and the image path for this host, and publishes the chain root first; if any
 * step fails, what it published is removed again.
 *
 * A pack names its snapshots by their tags without namespace (src/snapshot/namespace.ts): a
 * tenant's `alice/app` is packed as `app` (its meta.json rewritten so), and registered in the
 * namespace of whoever unpacks it.
 */
import { spawn } from "node:child_process";
import { chmod, copyFile, mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join, relative } from "node:path";
import { pipeline } from "node:stream/promises";
import { z } from "zod";
import { rebaseUnsafe } from "../disk/index.js";
import { plainLayerProblem } from "../disk/index.js";
import { IMAGE_FILES, findImage, imageAddress, importedDir } from "../image/index.js";
import type { ImageFile } from "../image/index.js";
import { exists, linkOrCopy } from "../util/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { isValidTag } from "../util/index.js";
import { childEnv } from "../util/index.js";
import { SnapshotMetaSchema, diffFieldsAgree, sha256File, withSource, writeMeta } from "./meta.js";
import type { SnapshotMeta } from "./meta.js";
import type { SnapshotStore } from "./store.js";
import type { CrashPoint } from "../util/index.js";
import { splitKey, visibleTo } from "./namespace.js";
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

/** The chain of `tag`, root first. */
async function chainOf(store: SnapshotStore, tag: string): Promise<SnapshotMeta[]> {
  const out: SnapshotMeta[] = [];
  for (let t: string | undefined = tag; t;) {
    const m: SnapshotMeta = (await store.get(t)).meta;
    out.unshift(m);
    if (out.length > 64) throw new ForkdError("snapshot_corrupt", `chain of ${tag} is deeper than 64`);
    t = m.parent?.tag;
  }
  // A diff's memory base is an ancestor (chain.ts keeps it so): the pack carries its image.
  for (const [i, m] of out.entries()) {
    if (m.memoryBase && !out.slice(0, i).some((a) => a.tag === m.memoryBase?.tag))
      throw new ForkdError("snapshot_corrupt", `snapshot ${m.tag}: its memory base is not in its chain`);
  }
  return out;
}

/**
 * Lays out `tag`'s pack in `dir` (hard links, no copies where the filesystem allows) and
 * returns the manifest; the caller tars `dir`. The chain is named by its tags without namespace:
 * a snapshot whose key has one gets a meta.json rewritten with those names (and the checksums
 * they make).
 */
export async function stagePack(store: SnapshotStore, tag: string, dir: string): Promise<Manifest> {
  const chain = await chainOf(store, tag);
  const root = chain[0] as SnapshotMeta;
  const files: Manifest["files"] = {};
  const nameOf = (key: string) => splitKey(key).name;
  const names = new Set(chain.map((m) => nameOf(m.tag)));
  if (names.size !== chain.length)
    throw new ForkdError("conflict", `chain of ${tag} has two snapshots of one tag: compact it to pack it`, {
      tag,
    });
  await mkdir(join(dir, "image"), { recursive: true });
  for (const f of IMAGE_FILES) {
    const to = join(dir, "image", f);
    await linkOrCopy(join(root.image.dir, f), to);
    files[`image/${f}`] = await sha256File(to);
  }
  /** Each snapshot's metadata checksum in the pack (a rewritten parent's changes its children's). */
  const packed = new Map<string, string>();
  for (const m of chain) {
    if (m.image.dir !== root.image.dir) {
      throw new ForkdError("snapshot_corrupt", `chain of ${tag} mixes guest images`);
    }
    const src = store.filesFor(m.tag);
    const name = nameOf(m.tag);
    const d = join(dir, "snapshots", name);
    await mkdir(d, { recursive: true });
    const mem = m.files.memoryDiff ? "memory.diff" : "memory";
    for (const f of [...ALWAYS_FILES, mem]) {
      if (f !== "meta.json") await linkOrCopy(join(src.dir, f), join(d, f));
    }
    const parentSum = m.parent ? (packed.get(m.parent.tag) ?? m.parent.checksum) : undefined;
    if (
      name === m.tag &&
      parentSum === m.parent?.checksum &&
      nameOf(m.memoryBase?.tag ?? "") === (m.memoryBase?.tag ?? "")
    ) {
      await linkOrCopy(join(src.dir, "meta.json"), join(d, "meta.json"));
      packed.set(m.tag, m.checksum);
    } else {
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
    }
    files[`snapshots/${name}/${mem}`] = m.files.memoryDiff ?? m.files.memory;
    files[`snapshots/${name}/vmstate`] = m.files.vmstate;
    files[`snapshots/${name}/disk.qcow2`] = m.files.disk;
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
): Promise<void> {
  const dir = store.stagingDir(`pack-${tag}-${Date.now().toString(36)}`);
  try {
    await stagePack(store, tag, dir);
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

/**
 * Reads and validates a pack's manifest.json (at most 16 MiB): its schema, and its shape: a
 * chain of distinct valid tags ending at its tag, and exactly the files such a pack has (the
 * image's four, four per snapshot of the chain), none larger than its kind may be.
 */
export function parsePackManifest(raw: string): PackManifest {
  if (raw.length > MAX_MANIFEST) throw new ForkdError("invalid_argument", "pack manifest is too large");
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw new ForkdError("invalid_argument", "pack manifest is missing or not JSON");
  }
  const r = PackManifestSchema.safeParse(json);
  if (!r.success) {
    const { field, message } = firstIssue(r.error);
    throw new ForkdError("invalid_argument", `pack manifest is invalid: ${field}: ${message}`, { field });
  }
  const m = r.data;
  const bad = (why: string, details: Record<string, unknown> = {}) =>
    new ForkdError("invalid_argument", `pack manifest: ${why}`, details);
  const tags = new Set<string>();
  for (const t of m.chain) {
    if (!isValidTag(t)) throw bad(`bad tag in its chain: ${JSON.stringify(t)}`, { field: "chain" });
    if (tags.has(t)) throw bad(`tag ${t} twice in its chain`, { field: "chain" });
    tags.add(t);
  }
  if (m.chain[m.chain.length - 1] !== m.tag) throw bad("chain does not end at its tag", { field: "tag" });
  const want = new Set<string>(IMAGE_FILES.map((f) => `image/${f}`));
  for (const t of m.chain) for (const f of ALWAYS_FILES) want.add(`snapshots/${t}/${f}`);
  // Each snapshot's memory: a full image or a diff (the root's is a full image).
  for (const [i, t] of m.chain.entries()) {
    const has = MEMORY_FILES.filter((f) => `snapshots/${t}/${f}` in m.files);
    if (has.length !== 1 || (i === 0 && has[0] !== "memory"))
      throw bad(`snapshot ${t} needs exactly one of memory and memory.diff (the first one: memory)`, {
        field: "files",
      });
    want.add(`snapshots/${t}/${has[0]}`);
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
  return m;
}

/** The image's file sums a pack manifest lists (parsePackManifest checked they are all there). */
function imageSums(m: PackManifest): Record<ImageFile, { size: number; sha256: string }> {
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
export const packImageAddress = (m: PackManifest): string => imageAddress(imageSums(m));

export interface RegisterOptions {
  /** Register the top of the chain under this tag instead of the pack's. */
  as?: string;
  /**
   * Files this host already has may be missing from the staging directory (see `presentHere`):
   * a pull does not download them.
   */
  allowPresent?: boolean;
  /** Sums of staged files computed as they were written (unpack): not read again. */
  verified?: Map<string, { size: number; sha256: string }>;
}

/** The tag the chain's `i`-th snapshot is registered under, as the unpacking caller names it. */
const localTag = (manifest: PackManifest, i: number, as: string | undefined): string =>
  (i === manifest.chain.length - 1 ? as : undefined) ?? (manifest.chain[i] as string);

/**
 * The store keys the chain's snapshots have or get here (root first): what the unpacking caller
 * sees under each tag, else a new key in its namespace (namespace.ts; a reserved tag is refused).
 */
export async function localKeys(deps: UnpackDeps, manifest: PackManifest, as?: string): Promise<string[]> {
  const out: string[] = [];
  for (let i = 0; i < manifest.chain.length; i++) {
    const t = localTag(manifest, i, as);
    out.push(deps.namespaces ? await deps.namespaces.place(deps.viewer ?? null, t) : t);
  }
  return out;
}

/**
 * Files of a pack that registration will not use because this host has them: the guest image's
 * when an image with the same content is here (by content address: image/content.ts), and the
 * memory, device state and disk layer of a snapshot of the chain that is here already
 * (registration then checks it is the same snapshot, or refuses). meta.json files are always
 * needed.
 */
export async function presentHere(
  deps: UnpackDeps,
  manifest: PackManifest,
  as?: string,
): Promise<Set<string>> {
  const out = new Set<string>();
  if (await findImage(deps.cacheDir, packImageAddress(manifest))) {
    for (const f of IMAGE_FILES) out.add(`image/${f}`);
  }
  const keys = await localKeys(deps, manifest, as);
  for (let i = 0; i < manifest.chain.length; i++) {
    const t = manifest.chain[i] as string;
    if (!isValidTag(t) || !(await deps.store.has(keys[i] as string))) continue;
    for (const f of ["memory", "memory.diff", "vmstate", "disk.qcow2"]) out.add(`snapshots/${t}/${f}`);
  }
  return out;
}

/**
 * The image directory for a pack's image of content `address`: one this host has (built or
 * imported, same files), else the staged one installed as <cache>/imported/<address> (read-only
 * files, one atomic rename; a concurrent install of the same content wins harmlessly).
 */
async function installImage(deps: UnpackDeps, staged: string, address: string): Promise<string> {
  const here = await findImage(deps.cacheDir, address);
  if (here) return here;
  const dest = importedDir(deps.cacheDir, address);
  await mkdir(join(deps.cacheDir, "imported"), { recursive: true, mode: 0o755 });
  for (const f of IMAGE_FILES) await chmod(join(staged, f), 0o444);
  await chmod(staged, 0o755);
  const installed = async (e: unknown): Promise<string> => {
    if (await exists(join(dest, "manifest.json"))) return dest; // a concurrent install won
    throw e;
  };
  try {
    await rename(staged, dest); // the staging directory is on the data directory's filesystem
    return dest;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "EXDEV") return installed(e);
  }
  // Another filesystem: copied next to its place first, then one rename.
  const tmp = join(deps.cacheDir, "imported", `.tmp-${stagingName(address.slice(0, 16))}`);
  try {
    await mkdir(tmp, { mode: 0o755 });
    for (const f of IMAGE_FILES) await copyFile(join(staged, f), join(tmp, f));
    await rename(tmp, dest).catch(installed);
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
  return dest;
}

/** A tool's error about `path` as a tenant may read it: the pack's own name, no host path. */
const scrub = (text: string, path: string, file: string): string => text.split(path).join(file).slice(0, 300);

/** A pack's disk layer must be a plain qcow2 layer (src/disk/plain-layer.ts); its backing file is replaced by ours. */
async function checkPackDisk(tools: ToolRunner, path: string, file: string): Promise<void> {
  const why = await plainLayerProblem(tools, path);
  if (why !== null)
    throw new ForkdError(
      "invalid_argument",
      `pack file ${file} is not a usable disk layer: ${scrub(why, path, file)}`,
      {
        file,
      },
    );
}

/** Reads and checks a staged snapshot's meta.json: a clear 400 naming the bad field. */
async function readPackMeta(dir: string, t: string): Promise<SnapshotMeta> {
  const file = `snapshots/${t}/meta.json`;
  const raw = await readFile(join(dir, file), "utf8").catch(() => null);
  if (raw === null) throw new ForkdError("invalid_argument", `pack lacks ${file}`, { file });
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw new ForkdError("invalid_argument", `pack file ${file} is not JSON`, { file });
  }
  const r = SnapshotMetaSchema.safeParse(json);
  if (!r.success) {
    const { field, message } = firstIssue(r.error);
    throw new ForkdError("invalid_argument", `pack file ${file} is invalid: ${field}: ${message}`, {
      file,
      field,
    });
  }
  return withSource(r.data);
}

/**
 * Registers the pack laid out in `dir` (manifest.json, image/, snapshots/<tag>/), whether it
 * came from a tar (unpack) or a registry (pull): every file the manifest lists must be there
 * with its size and sha256, and nothing else (with `allowPresent`, files this host has may be
 * absent: `presentHere`); the guest image is found by, or installed under, the content address
 * of those verified files; the chain is published root first, its disk layers rebased onto this
 * host's paths. All or nothing: a failure removes what it published. The caller removes `dir`.
 */
export async function registerStaged(
  deps: UnpackDeps,
  dir: string,
  o: RegisterOptions = {},
): Promise<Registered> {
  const { store } = deps;
  const published: string[] = [];
  try {
    const manifest = parsePackManifest(await readFile(join(dir, "manifest.json"), "utf8").catch(() => ""));
    // Every file the manifest names, with its size and hash; nothing else.
    const present = await listFiles(dir);
    const expected = new Set([...Object.keys(manifest.files), "manifest.json"]);
    for (const f of present) {
      if (!expected.has(f))
        throw new ForkdError("invalid_argument", `pack has a file its manifest does not list: ${f}`);
    }
    const mayLack = o.allowPresent ? await presentHere(deps, manifest, o.as) : new Set<string>();
    const have = new Set(present);
    for (const [f, sum] of Object.entries(manifest.files)) {
      if (!have.has(f) && mayLack.has(f)) continue;
      const got = o.verified?.get(f) ?? (await sha256File(join(dir, f)).catch(() => null));
      if (!got || got.size !== sum.size || got.sha256 !== sum.sha256) {
        throw new ForkdError("invalid_argument", `pack file ${f} does not match its checksum`, { file: f });
      }
    }
    const metas: SnapshotMeta[] = [];
    for (const t of manifest.chain) {
      const m = await readPackMeta(dir, t);
      if (m.tag !== t) throw new ForkdError("invalid_argument", `pack snapshot ${t} claims tag ${m.tag}`);
      if (m.machine.accel !== deps.accel) {
        throw new ForkdError(
          "invalid_argument",
          `snapshot ${t} was made under ${m.machine.accel}; this host runs ${deps.accel}, and device state only loads into the same machine`,
        );
      }
      checkPackMemory(manifest, metas, m);
      metas.push(m);
    }

    // Everything that can refuse the pack is checked before the image is installed: a chain
    // snapshot here with other content, a disk layer that is not a plain qcow2 layer.
    const keys = await localKeys(deps, manifest, o.as);
    /** A memory base's key here: that of the snapshot of the chain it names. */
    const keyOfBase = (name: string): string => keys[manifest.chain.indexOf(name)] ?? name;
    const viewer = deps.viewer ?? null;
    const local: (SnapshotMeta | null)[] = [];
    for (const [i, m] of metas.entries()) {
      const tag = keys[i] as string;
      const shown = localTag(manifest, i, o.as);
      if (!(await store.has(tag))) {
        // Only into the caller's own namespace (a shared tag being written or failed is not).
        if (viewer !== null && splitKey(tag).ns !== viewer)
          throw new ForkdError("conflict", `snapshot ${shown} is not ready here`, { tag: shown });
        await checkPackDisk(
          deps.tools,
          join(dir, "snapshots", m.tag, "disk.qcow2"),
          `snapshots/${m.tag}/disk.qcow2`,
        );
        local.push(null);
        continue;
      }
      const here = (await store.get(tag)).meta;
      const mine = visibleTo(viewer, tag, here.owner);
      const same =
        mine &&
        here.files.memory.sha256 === m.files.memory.sha256 &&
        here.files.memoryDiff?.sha256 === m.files.memoryDiff?.sha256 &&
        here.files.vmstate.sha256 === m.files.vmstate.sha256;
      if (!same) {
        throw new ForkdError("conflict", `snapshot ${shown} already exists here with other content`, {
          tag: shown,
        });
      }
      local.push(here);
    }

    // The guest image, by the content address of its verified files: this host's copy of the
    // same content, else installed under that address (never under the hash the pack claims).
    const address = packImageAddress(manifest);
    const imageDir = have.has("image/rootfs.ext4")
      ? await installImage(deps, join(dir, "image"), address)
      : await findImage(deps.cacheDir, address);
    if (!imageDir || (deps.pin && !(await deps.pin(imageDir))))
      throw new ForkdError("conflict", "the pack's guest image is no longer on this host");

    // Root first: rebase each disk layer onto this host's paths, rewrite metadata, publish.
    let parentMeta: SnapshotMeta | null = null;
    for (const [i, m] of metas.entries()) {
      const src = join(dir, "snapshots", m.tag);
      const tag = keys[i] as string;
      const here = local[i];
      if (here) {
        parentMeta = here; // shared base: already here
        continue;
      }
      const release = await store.claim(tag);
      try {
        const disk = join(src, "disk.qcow2");
        const backing = parentMeta ? store.filesFor(parentMeta.tag).disk : join(imageDir, "rootfs.ext4");
        await rebaseUnsafe(deps.tools, disk, backing, parentMeta ? "qcow2" : "raw", 0o600).catch(
          (e: unknown) => {
            throw new ForkdError(
              "invalid_argument",
              `pack snapshot ${m.tag}: its disk layer is not a usable qcow2 image: ${scrub(errorMessage(e), disk, "disk.qcow2")}`,
              { file: `snapshots/${m.tag}/disk.qcow2` },
            );
          },
        );
        const { checksum: _c, tag: _t, files: sums, ...rest } = m;
        // The pack's meta.json is replaced; memory and device state were verified against the
        // pack's manifest (and their sums are what its metadata records); the rebased layer is hashed.
        await rm(join(src, "meta.json"));
        const meta = await store.seal(
          src,
          tag,
          {
            ...rest,
            image: { ...m.image, dir: imageDir, content: address },
            files: { memory: sums.memory, vmstate: sums.vmstate, memoryDiff: sums.memoryDiff },
            ...(parentMeta ? { parent: { tag: parentMeta.tag, checksum: parentMeta.checksum } } : {}),
            ...(m.memoryBase ? { memoryBase: { ...m.memoryBase, tag: keyOfBase(m.memoryBase.tag) } } : {}),
            owner: splitKey(tag).ns ?? viewer,
          },
          { beforePublish: () => deps.crash?.("unpack:before-publish") },
        );
        published.push(tag);
        parentMeta = meta;
      } finally {
        release();
      }
    }
    return { tag: keys[keys.length - 1] as string, published };
  } catch (e) {
    for (const t of [...published].reverse()) await store.delete(t).catch(() => undefined);
    throw mapPackError(e);
  }
}

/**
 * A pack snapshot's memory as its metadata describes it must be what the pack carries: a full
 * image under `memory` with the sum the manifest verified, or (format 3) a diff under
 * `memory.diff` whose memory base is an earlier snapshot of the chain with that very image.
 */
function checkPackMemory(manifest: PackManifest, earlier: SnapshotMeta[], m: SnapshotMeta): void {
  const bad = (why: string) =>
    new ForkdError("invalid_argument", `pack snapshot ${m.tag}: ${why}`, {
      file: `snapshots/${m.tag}/meta.json`,
    });
  const sameSum = (
    a: { size: number; sha256: string } | undefined,
    b: { size: number; sha256: string } | undefined,
  ) => a !== undefined && b !== undefined && a.size === b.size && a.sha256 === b.sha256;
  if (!diffFieldsAgree(m)) throw bad("memoryBase and files.memoryDiff go together");
  if (!m.memoryBase) {
    if (!sameSum(manifest.files[`snapshots/${m.tag}/memory`], m.files.memory))
      throw bad("its memory image is not the one its metadata records");
    return;
  }
  const baseTag = m.memoryBase.tag;
  const base = earlier.find((e) => e.tag === baseTag);
  if (!base || base.memoryBase) throw bad("its memory base is not a full image earlier in the chain");
  if (!sameSum(manifest.files[`snapshots/${m.tag}/memory.diff`], m.files.memoryDiff))
    throw bad("its memory diff is not the one its metadata records");
  if (base.files.memory.sha256 !== m.memoryBase.checksum || !sameSum(base.files.memory, m.files.memory))
    throw bad(`its memory base ${base.tag} has another image`);
}

async function listFiles(root: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (d: string) => {
    for (const e of await readdir(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.isFile()) out.push(relative(root, p));
      else throw new ForkdError("invalid_argument", `pack contains a non-regular file: ${relative(root, p)}`);
    }
  };
  await walk(root);
  return out;
}
