/**
 * Registration: a chain laid out in a staging directory (manifest.json, image/, snapshots/<dir>/)
 * becomes this node's snapshots, whether it came from a pack (unpack.ts), a registry or a pack
 * URL (pull.ts), or a peer of the cluster (peer-pull.ts). Every file the manifest lists must be
 * there with its size and sha256 (files this node has may be absent: presentHere), nothing else;
 * the guest image is found by, or installed under, the content address of those verified files
 * (image/content.ts: never under the build hash the manifest claims); each disk layer is checked
 * (a plain qcow2 layer) and rebased onto this node's paths; the chain is published root first.
 * All or nothing: a failure removes what it published.
 *
 * A pack's snapshots are named by plain tags and land in the namespace of whoever registers
 * them (namespace.ts), owned by it. A peer's (`sameKeys`) keep the store keys and owners they
 * have on the peer: an admin's registration only.
 */
import { chmod, copyFile, mkdir, readdir, readFile, rename, rm } from "node:fs/promises";
import { join, relative } from "node:path";
import { rebaseUnsafe } from "../disk/index.js";
import { plainLayerProblem } from "../disk/index.js";
import { IMAGE_FILES, findImage, importedDir } from "../image/index.js";
import { exists } from "../util/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { assertKey, isValidKey } from "../util/index.js";
import type { ToolRunner } from "../vmm/index.js";
import { SnapshotMetaSchema, diffFieldsAgree, sha256File, withSource } from "./meta.js";
import type { SnapshotMeta } from "./meta.js";
import { splitKey, visibleTo } from "./namespace.js";
import {
  firstIssue,
  mapPackError,
  packImageAddress,
  parsePackManifest,
  stagedDir,
  stagingName,
} from "./pack.js";
import type { PackManifest, Registered, UnpackDeps } from "./pack.js";
import { parsePeerManifest } from "./peer-manifest.js";
import type { PeerManifest } from "./peer-manifest.js";

/** A staged chain's manifest: a pack's (plain tags) or a peer's (store keys and owners). */
export type ChainManifest = PackManifest | PeerManifest;

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
  /**
   * The chain comes from a peer of the cluster: manifest.json is a peer manifest
   * (peer-manifest.ts), and each snapshot is registered under the key the peer holds it by,
   * owned as it is there. Only for an admin (deps.viewer null), never with `as`.
   */
  sameKeys?: boolean;
  /**
   * The store keys and owners the chain's snapshots get here (root first), as the cluster's
   * catalog names them: a pack pulled from the registry a peer pushed it to (its plain tags
   * are not the cluster's keys). Only for an admin (deps.viewer null), never with `as`.
   */
  keys?: { keys: string[]; owners: (string | null)[] };
}

/** The tag the chain's `i`-th snapshot is registered under, as the unpacking caller names it. */
const localTag = (manifest: ChainManifest, i: number, as: string | undefined): string =>
  (i === manifest.chain.length - 1 ? as : undefined) ?? (manifest.chain[i] as string);

/**
 * The store keys the chain's snapshots have or get here (root first): a peer's chain its own
 * keys (`sameKeys`); a pack's what the unpacking caller sees under each tag, else a new key in
 * its namespace (namespace.ts; a reserved tag is refused).
 */
export async function localKeys(
  deps: UnpackDeps,
  manifest: ChainManifest,
  o: RegisterOptions = {},
): Promise<string[]> {
  if (o.sameKeys) {
    if ((deps.viewer ?? null) !== null || o.as !== undefined)
      throw new ForkdError("forbidden", "a chain keeps its peer's keys only for an admin, under them");
    return [...manifest.chain];
  }
  if (o.keys) {
    if ((deps.viewer ?? null) !== null || o.as !== undefined)
      throw new ForkdError("forbidden", "a chain is registered under the cluster's keys only for an admin");
    if (o.keys.keys.length !== manifest.chain.length || o.keys.owners.length !== manifest.chain.length)
      throw new ForkdError(
        "invalid_argument",
        `the pulled chain has ${manifest.chain.length} snapshots; the cluster's catalog names ${o.keys.keys.length}`,
      );
    for (const k of o.keys.keys) assertKey(k);
    return [...o.keys.keys];
  }
  const out: string[] = [];
  for (let i = 0; i < manifest.chain.length; i++) {
    const t = localTag(manifest, i, o.as);
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
  manifest: ChainManifest,
  o: RegisterOptions = {},
): Promise<Set<string>> {
  const out = new Set<string>();
  if (await findImage(deps.cacheDir, packImageAddress(manifest))) {
    for (const f of IMAGE_FILES) out.add(`image/${f}`);
  }
  const keys = await localKeys(deps, manifest, o);
  for (let i = 0; i < manifest.chain.length; i++) {
    const t = manifest.chain[i] as string;
    if (!isValidKey(t) || !(await deps.store.has(keys[i] as string))) continue;
    for (const f of ["memory", "memory.diff", "vmstate", "disk.qcow2"]) out.add(`${stagedDir(t)}/${f}`);
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
  const file = `${stagedDir(t)}/meta.json`;
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
    const raw = await readFile(join(dir, "manifest.json"), "utf8").catch(() => "");
    const manifest: ChainManifest = o.sameKeys ? parsePeerManifest(raw) : parsePackManifest(raw);
    // Every file the manifest names, with its size and hash; nothing else.
    const present = await listFiles(dir);
    const expected = new Set([...Object.keys(manifest.files), "manifest.json"]);
    for (const f of present) {
      if (!expected.has(f))
        throw new ForkdError("invalid_argument", `pack has a file its manifest does not list: ${f}`);
    }
    const mayLack = o.allowPresent ? await presentHere(deps, manifest, o) : new Set<string>();
    const have = new Set(present);
    for (const [f, sum] of Object.entries(manifest.files)) {
      if (!have.has(f) && mayLack.has(f)) continue;
      const got = o.verified?.get(f) ?? (await sha256File(join(dir, f)).catch(() => null));
      if (!got || got.size !== sum.size || got.sha256 !== sum.sha256) {
        throw new ForkdError("invalid_argument", `pack file ${f} does not match its checksum`, { file: f });
      }
    }
    const metas: SnapshotMeta[] = [];
    for (const [i, t] of manifest.chain.entries()) {
      const m = await readPackMeta(dir, t);
      if (m.tag !== t) throw new ForkdError("invalid_argument", `pack snapshot ${t} claims tag ${m.tag}`);
      if ("owners" in manifest && (m.owner ?? null) !== manifest.owners[i])
        throw new ForkdError(
          "invalid_argument",
          `snapshot ${t}: its owner is not the one its manifest names`,
        );
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
    const keys = await localKeys(deps, manifest, o);
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
          join(dir, stagedDir(m.tag), "disk.qcow2"),
          `${stagedDir(m.tag)}/disk.qcow2`,
        );
        local.push(null);
        continue;
      }
      const here = (await store.get(tag)).meta;
      const mine = visibleTo(viewer, tag, here.owner);
      const same =
        mine &&
        (!o.sameKeys || (here.owner ?? null) === (m.owner ?? null)) &&
        (!o.keys || (here.owner ?? null) === (o.keys.owners[i] ?? null)) &&
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
      const src = join(dir, stagedDir(m.tag));
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
              { file: `${stagedDir(m.tag)}/disk.qcow2` },
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
            // A peer's snapshot keeps its owner (its manifest named it); a pack's is the caller's, or
            // under the cluster's keys, the catalog's owner.
            owner: o.sameKeys
              ? (m.owner ?? null)
              : o.keys
                ? (o.keys.owners[i] ?? null)
                : (splitKey(tag).ns ?? viewer),
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
function checkPackMemory(manifest: ChainManifest, earlier: SnapshotMeta[], m: SnapshotMeta): void {
  const bad = (why: string) =>
    new ForkdError("invalid_argument", `pack snapshot ${m.tag}: ${why}`, {
      file: `${stagedDir(m.tag)}/meta.json`,
    });
  const sameSum = (
    a: { size: number; sha256: string } | undefined,
    b: { size: number; sha256: string } | undefined,
  ) => a !== undefined && b !== undefined && a.size === b.size && a.sha256 === b.sha256;
  if (!diffFieldsAgree(m)) throw bad("memoryBase and files.memoryDiff go together");
  if (!m.memoryBase) {
    if (!sameSum(manifest.files[`${stagedDir(m.tag)}/memory`], m.files.memory))
      throw bad("its memory image is not the one its metadata records");
    return;
  }
  const baseTag = m.memoryBase.tag;
  const base = earlier.find((e) => e.tag === baseTag);
  if (!base || base.memoryBase) throw bad("its memory base is not a full image earlier in the chain");
  if (!sameSum(manifest.files[`${stagedDir(m.tag)}/memory.diff`], m.files.memoryDiff))
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
