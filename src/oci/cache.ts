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
 */
import { randomBytes } from "node:crypto";
import { mkdir, readdir, rm } from "node:fs/promises";
import { join, resolve } from "node:path";
import { isAlive } from "../util/proc.js";

const hex = (digest: string) => digest.replace(/^sha256:/, "");

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

  async init(): Promise<void> {
    for (const d of ["blobs/sha256", "layers/sha256", "rootfs/sha256", "tmp"]) {
      await mkdir(join(this.dir, d), { recursive: true, mode: 0o755 });
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
