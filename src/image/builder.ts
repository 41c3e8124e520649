/**
 * Guest images: guest/image/build.sh builds kernel, initramfs and root filesystem for a template
 * or from a given root tree (a pulled image), each stage cached by content hash under the cache
 * dir. This wrapper runs it, relays its progress and reads the resulting manifest.
 */
import { spawn } from "node:child_process";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ForkdError } from "../util/errors.js";
import { assertTemplate } from "../util/ids.js";
import { childEnv, downloadEnv } from "../util/proc.js";
import { builtImageAddress } from "./content.js";
import { forkdConfigFile, forkdEnvFile } from "./forkd-files.js";
import type { RootfsImage } from "./rootfs-image.js";

export interface GuestImage {
  /** The build hash (over the build's inputs: guest/image/build.sh). */
  hash: string;
  /** The content address of its files (content.ts). */
  content: string;
  dir: string;
  template: string;
  kernel: string;
  initrd: string;
  rootfs: string;
  kernelVersion: string;
}

export type ProgressFn = (line: string) => void;

export interface ImageBuilderOptions {
  /** The Debian archive to build from (FORKD_MIRROR; default: the one apt uses). */
  mirror?: string;
  /** Where the build's proxy settings come from (default: the daemon's environment). */
  env?: NodeJS.ProcessEnv;
}

export class ImageBuilder {
  constructor(
    private readonly repoDir: string,
    private readonly cacheDir: string,
    private readonly opts: ImageBuilderOptions = {},
  ) {}

  /** The templates there are (guest/image/templates/NAME.packages), sorted. */
  async templates(): Promise<string[]> {
    const names = await readdir(join(this.repoDir, "guest/image/templates")).catch(() => []);
    return names
      .filter((n) => n.endsWith(".packages"))
      .map((n) => n.slice(0, -".packages".length))
      .sort();
  }

  /** Throws `invalid_argument` (naming the known ones) unless `template` is one. */
  async assertKnown(template: string): Promise<void> {
    assertTemplate(template);
    const known = await this.templates();
    if (!known.includes(template)) {
      throw new ForkdError(
        "invalid_argument",
        `unknown template ${JSON.stringify(template)}; known: ${known.join(", ") || "none"}`,
        { field: "template", known },
      );
    }
  }

  /** Returns the image for `template`, building what is missing. Fast when cached. */
  async ensure(
    template: string,
    progress: ProgressFn = () => undefined,
    timeoutMs = 30 * 60_000,
  ): Promise<GuestImage> {
    await this.assertKnown(template);
    return this.load(await this.build(["--template", template], progress, timeoutMs));
  }

  /**
   * Returns the guest image of a pulled image: its tree as it is plus /.forkd/ (the agent, the
   * kernels, the image's Env and WorkingDir/User as /.forkd/env and /.forkd/config), keyed by
   * the image's digest and those files, so a second snapshot of the same image builds nothing.
   * `image.rootfs` is only read.
   */
  async ensureFromRootfs(
    image: RootfsImage,
    progress: ProgressFn = () => undefined,
    timeoutMs = 30 * 60_000,
  ): Promise<GuestImage> {
    const env = forkdEnvFile(image.config.env);
    const config = forkdConfigFile(image.config);
    const files = await mkdtemp(join(tmpdir(), "forkd-image-files-"));
    try {
      if (env.length > 0) await writeFile(join(files, "env"), env, { mode: 0o644 });
      if (config.length > 0) await writeFile(join(files, "config"), config, { mode: 0o644 });
      const args = ["--rootfs-dir", image.rootfs, "--rootfs-key", image.digest, "--forkd-files", files];
      return await this.load(await this.build(args, progress, timeoutMs));
    } finally {
      await rm(files, { recursive: true, force: true });
    }
  }

  /** Runs build.sh with `args` (and the cache, the mirror); resolves to the image directory. */
  private build(args: string[], progress: ProgressFn, timeoutMs: number): Promise<string> {
    const script = join(this.repoDir, "guest/image/build.sh");
    const mirror = this.opts.mirror ? ["--mirror", this.opts.mirror] : [];
    return new Promise<string>((resolve, reject) => {
      // It downloads packages: proxy and TLS trust settings, nothing else of the daemon's.
      const child = spawn("bash", [script, ...args, "--cache", this.cacheDir, ...mirror], {
        stdio: ["ignore", "pipe", "pipe"],
        env: childEnv(downloadEnv(this.opts.env), this.opts.env),
      });
      let stdout = "";
      let errTail = "";
      let partial = "";
      const timer = setTimeout(() => child.kill("SIGTERM"), timeoutMs);
      child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
      child.stderr.on("data", (d: Buffer) => {
        partial += d.toString();
        const lines = partial.split("\n");
        partial = lines.pop() ?? "";
        for (const line of lines) {
          errTail = (errTail + line + "\n").slice(-4000);
          if (/^(STEP|DONE|\.\.\.)/.test(line)) progress(line);
        }
      });
      child.on("error", reject);
      child.on("close", (code) => {
        clearTimeout(timer);
        if (code === 0) resolve(stdout.trim().split("\n").pop() ?? "");
        else
          reject(
            new ForkdError(
              "image_error",
              `guest image build failed (exit ${code}): ${errTail.trim().split("\n").slice(-8).join(" | ")}`,
            ),
          );
      });
    });
  }

  async load(dir: string): Promise<GuestImage> {
    let manifest: { image_hash: string; template: string; kernel_version: string };
    try {
      manifest = JSON.parse(await readFile(join(dir, "manifest.json"), "utf8")) as typeof manifest;
    } catch (e) {
      throw new ForkdError("image_error", `no valid guest image at ${dir}`, {}, e);
    }
    const content = await builtImageAddress(dir);
    if (!content) throw new ForkdError("image_error", `${dir} is not an image the builder made`);
    return {
      hash: manifest.image_hash,
      content,
      dir,
      template: manifest.template,
      kernel: join(dir, "vmlinuz"),
      initrd: join(dir, "initrd.img"),
      rootfs: join(dir, "rootfs.ext4"),
      kernelVersion: manifest.kernel_version,
    };
  }
}
