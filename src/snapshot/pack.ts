/**
 * Packs: a snapshot (with every ancestor of its chain and the guest image it needs) as one
 * zstd-compressed tar that restores on another host with nothing else.
 *
 *   manifest.json              {format, tag, chain (root first), image, files: {path: {size, sha256}}}
 *   image/                     vmlinuz, initrd.img, rootfs.ext4, manifest.json (the guest image)
 *   snapshots/<tag>/           meta.json, memory, vmstate, disk.qcow2 for every tag of the chain
 *
 * Unpacking refuses anything but plain files and directories at the expected paths, checks
 * every file's size and sha256 before registering anything, rewrites the disk layers' backing
 * paths and the image path for this host, and publishes the chain root first; if any step
 * fails, what it published is removed again.
 */
import { spawn } from "node:child_process";
import { createWriteStream } from "node:fs";
import { copyFile, mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join, relative } from "node:path";
import { pipeline } from "node:stream/promises";
import type { Readable } from "node:stream";
import { z } from "zod";
import { createOverlay, rebaseUnsafe } from "../disk/overlay.js";
import { exists, linkOrCopy } from "../util/fs.js";
import { ForkdError, errorMessage } from "../util/errors.js";
import { isValidTag } from "../util/ids.js";
import { childEnv, run } from "../util/proc.js";
import { SnapshotMetaSchema, sha256File, writeMeta } from "./meta.js";
import type { SnapshotMeta } from "./meta.js";
import type { SnapshotStore } from "./store.js";
import type { CrashPoint } from "../util/crash.js";

export const PACK_FORMAT = "forkd-pack/1";
/** The guest image's files; its manifest.json is what marks an image directory complete. */
const IMAGE_FILES = ["vmlinuz", "initrd.img", "rootfs.ext4", "manifest.json"] as const;
const SNAPSHOT_FILES = ["meta.json", "memory", "vmstate", "disk.qcow2"] as const;
const MAX_ENTRIES = 4096;
/** A pack manifest names at most 64 snapshots of 4 files and an image: far below this. */
const MAX_MANIFEST = 16 << 20;

const FileSum = z.object({
  size: z.number().int().nonnegative(),
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
  return out;
}

/**
 * Lays out `tag`'s pack in `dir` (hard links, no copies where the filesystem allows) and
 * returns the manifest; the caller tars `dir`.
 */
export async function stagePack(store: SnapshotStore, tag: string, dir: string): Promise<Manifest> {
  const chain = await chainOf(store, tag);
  const root = chain[0] as SnapshotMeta;
  const files: Manifest["files"] = {};
  await mkdir(join(dir, "image"), { recursive: true });
  for (const f of IMAGE_FILES) {
    const to = join(dir, "image", f);
    await linkOrCopy(join(root.image.dir, f), to);
    files[`image/${f}`] = await sha256File(to);
  }
  for (const m of chain) {
    if (m.image.hash !== root.image.hash) {
      throw new ForkdError("snapshot_corrupt", `chain of ${tag} mixes guest images`);
    }
    const src = store.filesFor(m.tag);
    const d = join(dir, "snapshots", m.tag);
    await mkdir(d, { recursive: true });
    for (const f of SNAPSHOT_FILES) await linkOrCopy(join(src.dir, f), join(d, f));
    files[`snapshots/${m.tag}/memory`] = m.files.memory;
    files[`snapshots/${m.tag}/vmstate`] = m.files.vmstate;
    files[`snapshots/${m.tag}/disk.qcow2`] = m.files.disk;
    files[`snapshots/${m.tag}/meta.json`] = await sha256File(join(d, "meta.json"));
  }
  const manifest: Manifest = {
    format: PACK_FORMAT,
    created: new Date().toISOString(),
    tag,
    chain: chain.map((m) => m.tag),
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
    const tar = spawn("tar", ["--zstd", "--sparse", "-cf", "-", "-C", dir, "."], {
      stdio: ["ignore", "pipe", "pipe"],
      env: childEnv(),
    });
    let err = "";
    tar.stderr.on("data", (c: Buffer) => (err += c.toString()));
    const exited = new Promise<number | null>((r) => tar.once("close", r));
    crash?.("pack:streaming");
    await pipeline(tar.stdout, out);
    if ((await exited) !== 0) throw new ForkdError("internal", `tar failed: ${err.trim()}`);
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

/** Checks a tar listing: only plain files and directories, only where a pack has them. */
export function checkListing(listing: string): void {
  const lines = listing.split("\n").filter((l) => l.length > 0);
  if (lines.length > MAX_ENTRIES) throw new ForkdError("invalid_argument", "pack has too many entries");
  for (const line of lines) {
    const type = line[0];
    // `tar -tv`: "-rw-r--r-- root/root 123 2026-01-01 00:00 ./path"
    const name = line.split(/\s+/).slice(5).join(" ");
    if (type !== "-" && type !== "d") {
      throw new ForkdError(
        "invalid_argument",
        `pack entry ${JSON.stringify(name)} is not a plain file or directory`,
      );
    }
    const p = name.replace(/^\.\//, "").replace(/\/$/, "");
    if (p === "" || p === ".") continue;
    if (p.startsWith("/") || p.split("/").some((x) => x === ".." || x === "." || x === "")) {
      throw new ForkdError("invalid_argument", `pack entry ${JSON.stringify(name)} escapes the pack`);
    }
    if (!isPackPath(p, type === "d")) {
      throw new ForkdError("invalid_argument", `unexpected pack entry ${JSON.stringify(name)}`);
    }
  }
}

export interface UnpackDeps {
  store: SnapshotStore;
  /** Where guest images live (<cache>/images/<hash>). */
  imagesDir: string;
  /** This host's accelerator: a snapshot restores only into the same kind of machine. */
  accel: "kvm" | "tcg";
  /**
   * The tenant unpacking (null: an admin): owns what is published; a base already here is
   * reused only if it is theirs or shared.
   */
  owner?: string | null;
  /** Test-only fault injection (src/util/crash.ts). */
  crash?: CrashPoint;
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

/** Reads a pack from `input` and registers its chain. Returns the tags published. */
export async function unpackSnapshot(
  deps: UnpackDeps,
  input: Readable,
  o: { as?: string } = {},
): Promise<Registered> {
  const dir = deps.store.stagingDir(stagingName("unpack"));
  const archive = `${dir}.tar.zst`;
  try {
    // Consume `input` before anything else is awaited (its errors need a listener).
    await pipeline(input, createWriteStream(archive, { mode: 0o600 }));
    await mkdir(dir, { mode: 0o700 });
    const { stdout: listing } = await run("tar", ["--zstd", "-tvf", archive], { timeoutMs: 600_000 }).catch(
      (e: unknown) => {
        throw new ForkdError("invalid_argument", `not a readable pack: ${errorMessage(e)}`);
      },
    );
    checkListing(listing);
    await run("tar", ["--zstd", "-xf", archive, "-C", dir, "--no-same-owner", "--no-same-permissions"], {
      timeoutMs: 3_600_000,
    });
    await rm(archive, { force: true });
    deps.crash?.("unpack:extracted");
    return await registerStaged(deps, dir, o);
  } finally {
    await rm(dir, { recursive: true, force: true });
    await rm(archive, { force: true });
  }
}

/** Reads and validates a staged pack's manifest.json (at most 16 MiB). */
export function parsePackManifest(raw: string): PackManifest {
  if (raw.length > MAX_MANIFEST) throw new ForkdError("invalid_argument", "pack manifest is too large");
  try {
    return PackManifestSchema.parse(JSON.parse(raw));
  } catch (e) {
    throw new ForkdError("invalid_argument", `pack manifest is missing or invalid: ${errorMessage(e)}`);
  }
}

export interface RegisterOptions {
  /** Register the top of the chain under this tag instead of the pack's. */
  as?: string;
  /**
   * Files this host already has may be missing from the staging directory (see `presentHere`):
   * a pull does not download them.
   */
  allowPresent?: boolean;
}

/** The tag the chain's `i`-th snapshot is registered under. */
const localTag = (manifest: PackManifest, i: number, as: string | undefined): string =>
  (i === manifest.chain.length - 1 ? as : undefined) ?? (manifest.chain[i] as string);

/**
 * Files of a pack that registration will not use because this host has them: the guest image's
 * when that image is installed, and the memory, device state and disk layer of a snapshot of
 * the chain that is here already (registration then checks it is the same snapshot, or
 * refuses). meta.json files are always needed.
 */
export async function presentHere(
  deps: UnpackDeps,
  manifest: PackManifest,
  as?: string,
): Promise<Set<string>> {
  const out = new Set<string>();
  if (await exists(join(deps.imagesDir, manifest.image.hash, "manifest.json"))) {
    for (const f of IMAGE_FILES) out.add(`image/${f}`);
  }
  for (let i = 0; i < manifest.chain.length; i++) {
    const t = manifest.chain[i] as string;
    if (!isValidTag(t) || !(await deps.store.has(localTag(manifest, i, as)))) continue;
    for (const f of ["memory", "vmstate", "disk.qcow2"]) out.add(`snapshots/${t}/${f}`);
  }
  return out;
}

/**
 * Registers the pack laid out in `dir` (manifest.json, image/, snapshots/<tag>/), whether it
 * came from a tar (unpack) or a registry (pull): every file the manifest lists must be there
 * with its size and sha256, and nothing else (with `allowPresent`, files this host has may be
 * absent: `presentHere`); the guest image is installed if this host lacks it; the chain is
 * published root first, its disk layers rebased onto this host's paths. All or nothing: a
 * failure removes what it published. The caller removes `dir`.
 */
export async function registerStaged(
  deps: UnpackDeps,
  dir: string,
  o: RegisterOptions = {},
): Promise<Registered> {
  const { store } = deps;
  const published: string[] = [];
  try {
    if (o.as !== undefined && !isValidTag(o.as)) throw new ForkdError("invalid_argument", "bad tag");
    const manifest = parsePackManifest(await readFile(join(dir, "manifest.json"), "utf8").catch(() => ""));
    for (const f of Object.keys(manifest.files)) {
      if (f === "manifest.json" || !isPackPath(f, false)) {
        throw new ForkdError(
          "invalid_argument",
          `pack manifest lists an unexpected path: ${JSON.stringify(f)}`,
        );
      }
    }
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
      const got = await sha256File(join(dir, f)).catch(() => null);
      if (!got || got.size !== sum.size || got.sha256 !== sum.sha256) {
        throw new ForkdError("invalid_argument", `pack file ${f} does not match its checksum`, { file: f });
      }
    }
    const metas: SnapshotMeta[] = [];
    for (const t of manifest.chain) {
      if (!isValidTag(t)) throw new ForkdError("invalid_argument", `bad tag in pack: ${JSON.stringify(t)}`);
      const m = SnapshotMetaSchema.parse(
        JSON.parse(await readFile(join(dir, "snapshots", t, "meta.json"), "utf8")),
      );
      if (m.tag !== t) throw new ForkdError("invalid_argument", `pack snapshot ${t} claims tag ${m.tag}`);
      if (m.machine.accel !== deps.accel) {
        throw new ForkdError(
          "invalid_argument",
          `snapshot ${t} was made under ${m.machine.accel}; this host runs ${deps.accel}, and device state only loads into the same machine`,
        );
      }
      metas.push(m);
    }
    if (manifest.chain[manifest.chain.length - 1] !== manifest.tag) {
      throw new ForkdError("invalid_argument", "pack manifest: chain does not end at its tag");
    }

    // The guest image: reuse this host's copy of the same content, else install it.
    const imageDir = join(deps.imagesDir, manifest.image.hash);
    if (!(await exists(join(imageDir, "manifest.json")))) {
      const tmp = `${imageDir}.unpack-${Date.now().toString(36)}`;
      await mkdir(deps.imagesDir, { recursive: true });
      await rename(join(dir, "image"), tmp).catch(async () => {
        await mkdir(tmp, { recursive: true });
        for (const f of IMAGE_FILES) await copyFile(join(dir, "image", f), join(tmp, f));
      });
      await rename(tmp, imageDir);
    }

    // Root first: rebase each disk layer onto this host's paths, rewrite metadata, publish.
    let parentMeta: SnapshotMeta | null = null;
    for (const [i, m] of metas.entries()) {
      const src = join(dir, "snapshots", m.tag);
      const tag = localTag(manifest, i, o.as);
      if (await store.has(tag)) {
        const local = (await store.get(tag)).meta;
        const mine =
          !deps.owner || local.owner === null || local.owner === undefined || local.owner === deps.owner;
        const same =
          mine &&
          local.files.memory.sha256 === m.files.memory.sha256 &&
          local.files.vmstate.sha256 === m.files.vmstate.sha256;
        if (!same)
          throw new ForkdError("conflict", `snapshot ${tag} already exists here with other content`, {
            tag,
          });
        parentMeta = local; // shared base: already here
        continue;
      }
      const release = await store.claim(tag);
      try {
        const disk = join(src, "disk.qcow2");
        const backing = parentMeta ? store.filesFor(parentMeta.tag).disk : join(imageDir, "rootfs.ext4");
        await rebaseUnsafe(disk, backing, parentMeta ? "qcow2" : "raw");
        const { checksum: _c, ...rest } = m;
        await rm(join(src, "meta.json"));
        const meta = await writeMeta(join(src, "meta.json"), {
          ...rest,
          tag,
          image: { ...m.image, dir: imageDir },
          files: { ...m.files, disk: await sha256File(disk) },
          ...(parentMeta ? { parent: { tag: parentMeta.tag, checksum: parentMeta.checksum } } : {}),
          owner: deps.owner ?? null,
        });
        await createOverlay(join(src, "child.qcow2"), {
          backing: store.filesFor(tag).disk,
          backingFormat: "qcow2",
          sizeBytes: m.diskSize,
          unsafe: true,
        });
        deps.crash?.("unpack:before-publish");
        await store.publish(src, tag);
        published.push(tag);
        parentMeta = meta;
      } finally {
        release();
      }
    }
    return { tag: localTag(manifest, manifest.chain.length - 1, o.as), published };
  } catch (e) {
    for (const t of [...published].reverse()) await store.delete(t).catch(() => undefined);
    throw e;
  }
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
