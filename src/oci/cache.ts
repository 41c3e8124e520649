/**
 * The image cache under `<cacheDir>/oci/`:
 *
 *   blobs/sha256/<hex>          manifests, indexes and configs, as the registry sent them
 *   layers/sha256/<hex>.tar     layers, uncompressed, by their diff_id (so a layer shared by two
 *                               images, or sent gzip by one and zstd by another, is fetched,
 *                               decompressed and verified once)
 *   rootfs/sha256/<hex>/        one flattened image, by its (platform) manifest digest:
 *                               image.json (what PulledImage says) and tree/ (the root)
 *   tmp/<pid>-<random>…         what is being written; renamed into place when complete
 *
 * Everything is content-addressed and written to tmp/ first (fsynced, then renamed), so what
 * is in place is complete and verified. Temporaries of processes that no longer run are swept.
 *
 * oci/ and every directory above the trees (blobs/, layers/, rootfs/, tmp/, their sha256/, one
 * image's rootfs/sha256/<hex>/ and a staging directory) are 0700, and init() makes those that
 * exist 0700 (a cache of an earlier forkd had 0755): a tree keeps the image's setuid binaries,
 * file capabilities, its root's own mode (0777 is possible) and 1777 directories, which no other
 * host user may reach, and layers and blobs may be a private image's.
 */
import { randomBytes } from "node:crypto";
import { chmod, mkdir, readdir, rm } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { isAlive } from "../util/index.js";

const hex = (digest: string) => digest.replace(/^sha256:/, "");

/** The mode of every directory the cache makes above the trees. */
export const CACHE_DIR_MODE = 0o700;

export class ImageCache {
  readonly dir: string;
  constructor(cacheDir: string) {
    this.dir = resolve(cacheDir, "oci");
  }
  blob(digest: string): string {
    return join(this.dir, "blobs", "sha256", hex(digest));
  }
  layer(diffId: string): string {
    return join(this.dir, "layers", "sha256", `${hex(diffId)}.tar`);
  }
  rootfs(manifestDigest: string): string {
    return join(this.dir, "rootfs", "sha256", hex(manifestDigest));
  }
  get tmpDir(): string {
    return join(this.dir, "tmp");
  }
  /** A fresh temporary name in tmp/ (not created). */
  tmp(what: string): string {
    return join(this.tmpDir, `${process.pid}-${randomBytes(6).toString("hex")}-${what}`);
  }

  /** Makes oci/ and its directories, 0700 (also those that were there with another mode). */
  async init(): Promise<void> {
    await mkdir(dirname(this.dir), { recursive: true }); // the cache root: not ours to tighten
    await mkdir(this.dir, { recursive: true, mode: CACHE_DIR_MODE });
    await chmod(this.dir, CACHE_DIR_MODE);
    for (const d of ["blobs", "blobs/sha256", "layers", "layers/sha256", "rootfs", "rootfs/sha256", "tmp"]) {
      await mkdir(join(this.dir, d), { recursive: true, mode: CACHE_DIR_MODE });
      await chmod(join(this.dir, d), CACHE_DIR_MODE);
    }
    // One image's directory (image.json and tree/): renamed from a staging one, 0755 before.
    for (const name of await readdir(join(this.dir, "rootfs", "sha256"))) {
      await chmod(join(this.dir, "rootfs", "sha256", name), CACHE_DIR_MODE).catch(() => undefined);
    }
  }

  /** Removes what dead processes left in tmp/ (a pull killed half-way). */
  async sweep(): Promise<void> {
    for (const name of await readdir(this.tmpDir).catch(() => [] as string[])) {
      const pid = Number(/^(\d+)-/.exec(name)?.[1]);
      if (!Number.isSafeInteger(pid) || pid <= 0 || (pid !== process.pid && !isAlive(pid))) {
        await rm(join(this.tmpDir, name), { recursive: true, force: true });
      }
    }
  }
}
