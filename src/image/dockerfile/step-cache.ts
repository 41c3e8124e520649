/**
 * The Dockerfile step cache under `<cache>/dockerfile/`:
 *
 *   layers/<key>/layer.qcow2   the disk after a step: a qcow2 layer over its parent step's layer
 *   layers/<key>/step.json     what made it (its parent key, instruction, line); written before
 *                              the directory is renamed into place, so a layer there is complete
 *   images/<address>/          a finished build's guest image (vmlinuz, initrd.img, rootfs.ext4,
 *                              manifest.json), by content address (image/content.ts findImage)
 *   results/<key>.json         the image address a final step key produced
 *   tmp/                       builds in progress; never read as cache (a killed build's leftovers
 *                              are removed by the next build once their process is gone)
 *
 * A key is sha256 over its parent's key and the step (step keys in build.ts), so a layer is
 * only ever found by a build whose earlier steps are the same. Two builds committing the same key
 * at once: the first wins, and the second commits none of its later layers (commit-chain.ts).
 *
 * dockerfile/ and its directories are 0700 (made so when they were there with another mode):
 * the layers and images hold what the images' RUN steps made (setuid binaries, a private
 * image's files). Jailed VMMs get their files bind-mounted, never through these directories.
 */
import { randomBytes } from "node:crypto";
import { chmod, mkdir, readdir, readFile, rename, rm } from "node:fs/promises";
import { dirname } from "node:path";
import { join } from "node:path";
import { fsyncDir, writeJsonAtomic } from "../../util/index.js";
import { exists } from "../../util/index.js";
import { isAlive } from "../../util/index.js";

const KEY_RE = /^[0-9a-f]{64}$/;
/** The mode of dockerfile/ and of every directory in it. */
const DIR_MODE = 0o700;

export class StepCache {
  readonly root: string;

  constructor(cacheDir: string) {
    this.root = join(cacheDir, "dockerfile");
  }

  layer(key: string): string {
    return join(this.root, "layers", key, "layer.qcow2");
  }

  async has(key: string): Promise<boolean> {
    return KEY_RE.test(key) && (await exists(join(this.root, "layers", key, "step.json")));
  }

  /** Makes dockerfile/ and `sub` in it (each 0700, also when it was there with another mode). */
  private async dir(sub: string): Promise<string> {
    await mkdir(dirname(this.root), { recursive: true }); // the cache root: not ours to tighten
    for (const d of [this.root, join(this.root, sub)]) {
      await mkdir(d, { recursive: true, mode: DIR_MODE });
      await chmod(d, DIR_MODE);
    }
    return join(this.root, sub);
  }

  /** A fresh working directory for one build (removed by the caller). */
  async workDir(): Promise<string> {
    const tmp = await this.dir("tmp");
    // Every build starts here: the images/ an earlier forkd made 0755 is fixed too.
    await this.dir("images");
    await this.sweep(tmp);
    const dir = join(tmp, `build-${process.pid}-${randomBytes(6).toString("hex")}`);
    await mkdir(dir, { mode: DIR_MODE });
    return dir;
  }

  /**
   * Moves the finished layer file `file` into the cache as `key`; false (and `file` left where it
   * is) when another build committed the same key first: its layer is kept (commit-chain.ts says
   * what the caller must then do).
   */
  async commit(key: string, file: string, info: Record<string, unknown>): Promise<boolean> {
    if (await this.has(key)) return false;
    const layers = await this.dir("layers");
    const tmp = join(layers, `.${key}.tmp-${randomBytes(6).toString("hex")}`);
    await mkdir(tmp, { mode: DIR_MODE });
    try {
      await rename(file, join(tmp, "layer.qcow2"));
      await writeJsonAtomic(join(tmp, "step.json"), { format: "forkd-dockerfile-step/1", key, ...info });
      await rename(tmp, join(layers, key));
      await fsyncDir(layers);
      return true;
    } catch (e) {
      // Put the file back where the caller has it: its later layers are backed by it.
      await rename(join(tmp, "layer.qcow2"), file).catch(() => undefined);
      await rm(tmp, { recursive: true, force: true });
      if (await this.has(key)) return false; // another build committed the same step first
      throw e;
    }
  }

  imagesDir(): string {
    return join(this.root, "images");
  }

  async result(key: string): Promise<string | null> {
    try {
      const r = JSON.parse(await readFile(join(this.root, "results", `${key}.json`), "utf8")) as {
        address?: unknown;
      };
      if (typeof r.address !== "string" || !KEY_RE.test(r.address)) return null;
      return (await exists(join(this.imagesDir(), r.address, "manifest.json"))) ? r.address : null;
    } catch {
      return null;
    }
  }

  async setResult(key: string, address: string): Promise<void> {
    await this.dir("results");
    await writeJsonAtomic(join(this.root, "results", `${key}.json`), { address });
  }

  /** Removes working directories of builds whose process is gone (a daemon killed mid-build). */
  private async sweep(tmp: string): Promise<void> {
    for (const name of await readdir(tmp).catch(() => [] as string[])) {
      const m = /^build-(\d+)-/.exec(name);
      if (!m || (Number(m[1]) !== process.pid && !isAlive(Number(m[1])))) {
        await rm(join(tmp, name), { recursive: true, force: true }).catch(() => undefined);
      }
    }
  }
}
