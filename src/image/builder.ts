/**
 * Guest images: guest/image/build.sh builds kernel, initramfs and root filesystem for a template
 * or from a given root tree (a pulled image), each stage cached by content hash under the cache
 * dir. This wrapper runs it, relays its progress and reads the resulting manifest.
 *
 * build.sh runs in a process group of its own: on its timeout, or when the daemon closes the
 * builder, the whole group gets SIGTERM (build.sh's trap cleans up), then SIGKILL after a
 * grace, so none of its children (tar, mkfs.ext4, e2fsck) outlives it holding the pipes. A build
 * settles when build.sh exits (its output read until its pipes close, or for a bounded time:
 * what is left in its group then is killed), never later.
 *
 * build.sh's mkfs.ext4 and e2fsck run as the daemon, not jailed (src/vmm/jailed-tools.ts): they
 * parse nothing a guest or a tenant wrote. mkfs copies a root tree file by file (a pulled image's
 * is forkd's own flattening, its entries checked: src/oci/flatten.ts), and e2fsck -n reads the
 * file system mkfs has just made. A disk a guest wrote (a Dockerfile build's) is checked jailed
 * (src/image/dockerfile/fsck.ts).
 */
import { spawn } from "node:child_process";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ForkdError } from "../util/index.js";
import { assertTemplate } from "../util/index.js";
import { childEnv, downloadEnv } from "../util/index.js";
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
  /** How long build.sh has from SIGTERM to SIGKILL (default 10 s: its cleanup's own waits). */
  killGraceMs?: number;
}

/** How long a build's pipes may stay open after build.sh exited (strays of its group). */
const DRAIN_MS = 2_000;

export class ImageBuilder {
  /** Kills of the builds running now (close() runs them). */
  private readonly running = new Set<(why: Error) => Promise<void>>();
  private closed = false;

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
    signal?: AbortSignal,
  ): Promise<GuestImage> {
    await this.assertKnown(template);
    return this.load(await this.build(["--template", template], progress, timeoutMs, signal));
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
    signal?: AbortSignal,
  ): Promise<GuestImage> {
    const env = forkdEnvFile(image.config.env);
    const config = forkdConfigFile(image.config);
    const files = await mkdtemp(join(tmpdir(), "forkd-image-files-"));
    try {
      if (env.length > 0) await writeFile(join(files, "env"), env, { mode: 0o644 });
      if (config.length > 0) await writeFile(join(files, "config"), config, { mode: 0o644 });
      const args = ["--rootfs-dir", image.rootfs, "--rootfs-key", image.digest, "--forkd-files", files];
      return await this.load(await this.build(args, progress, timeoutMs, signal));
    } finally {
      await rm(files, { recursive: true, force: true });
    }
  }

  /** Stops every running build (its whole process group) and waits until each has settled. */
  async close(): Promise<void> {
    this.closed = true;
    const why = new ForkdError("unavailable", "the daemon is stopping: guest image build cancelled");
    await Promise.all([...this.running].map((kill) => kill(why)));
  }

  /** Runs build.sh with `args` (and the cache, the mirror); resolves to the image directory. */
  private build(
    args: string[],
    progress: ProgressFn,
    timeoutMs: number,
    signal?: AbortSignal,
  ): Promise<string> {
    if (this.closed) {
      return Promise.reject(new ForkdError("unavailable", "the daemon is stopping: no guest image build"));
    }
    const script = join(this.repoDir, "guest/image/build.sh");
    const mirror = this.opts.mirror ? ["--mirror", this.opts.mirror] : [];
    const grace = this.opts.killGraceMs ?? 10_000;
    return new Promise<string>((resolve, reject) => {
      // It downloads packages: proxy and TLS trust settings, nothing else of the daemon's.
      const child = spawn("bash", [script, ...args, "--cache", this.cacheDir, ...mirror], {
        stdio: ["ignore", "pipe", "pipe"],
        env: childEnv(downloadEnv(this.opts.env), this.opts.env),
        detached: true, // its own process group: killed whole
      });
      const pid = child.pid;
      const group = (sig: NodeJS.Signals) => {
        if (pid === undefined) return;
        try {
          process.kill(-pid, sig);
        } catch {
          // the group is gone already
        }
      };
      let stdout = "";
      let errTail = "";
      let partial = "";
      /** Why the build was stopped (timeout, close()); null: it ran to its end. */
      let stopped: Error | null = null;
      let exit: { code: number | null; signal: NodeJS.Signals | null } | null = null;
      let settled = false;
      let drain: NodeJS.Timeout | undefined;
      let hardKill: NodeJS.Timeout | undefined;
      let onSettled: () => void = () => undefined;
      const settledP = new Promise<void>((r) => (onSettled = r));
      const stop = (why: Error): Promise<void> => {
        if (!settled && !stopped) {
          stopped = why;
          group("SIGTERM");
          hardKill = setTimeout(() => group("SIGKILL"), grace);
        }
        return settledP;
      };
      this.running.add(stop);
      const timer = setTimeout(
        () =>
          void stop(
            new ForkdError("timeout", `guest image build did not finish within ${timeoutMs} ms (stopped)`),
          ),
        timeoutMs,
      );
      const onAbort = () =>
        void stop(
          signal?.reason instanceof Error
            ? signal.reason
            : new ForkdError("timeout", "guest image build cancelled"),
        );
      if (signal?.aborted) onAbort();
      else signal?.addEventListener("abort", onAbort, { once: true });
      const settle = (err: Error | null) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        clearTimeout(hardKill);
        clearTimeout(drain);
        this.running.delete(stop);
        signal?.removeEventListener("abort", onAbort);
        child.stdout.destroy();
        child.stderr.destroy();
        onSettled();
        if (err) reject(err);
        else resolve(stdout.trim().split("\n").pop() ?? "");
      };
      const finish = () => {
        if (!exit) return;
        if (stopped) return settle(stopped);
        if (exit.code === 0) return settle(null);
        const how = exit.code !== null ? `exit ${exit.code}` : `signal ${exit.signal}`;
        settle(
          new ForkdError(
            "image_error",
            `guest image build failed (${how}): ${errTail.trim().split("\n").slice(-8).join(" | ")}`,
          ),
        );
      };
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
      child.on("error", (e) => settle(e));
      child.on("exit", (code, signal) => {
        exit = { code, signal };
        // Its output is read until the pipes close; what of its group holds them past a bound
        // (a child left behind) is killed, and the build settles with what was read.
        drain = setTimeout(() => {
          group("SIGKILL");
          finish();
        }, DRAIN_MS);
      });
      child.on("close", finish);
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
