/**
 * ImagePuller: an OCI or Docker image reference → a flattened, cached root filesystem and the
 * image's config. The manifest is resolved with the project's registry client (the settings,
 * credentials and insecure-host rule push and pull use; anonymous bearer tokens answered from
 * the registry's challenge); an index or manifest list gives its linux/amd64 manifest. Layers
 * missing from the cache are fetched and verified (fetch.ts), then the layers are flattened
 * (flatten.ts) into a staging tree renamed into place by the manifest digest (cache.ts). A
 * second ensure() of a cached image reads its manifest (for a tag: tags move) and nothing else;
 * one by digest makes no request at all. Concurrent ensure()s of one image, or of two sharing a
 * layer, share the work (single flight here; atomic renames between processes). A tenant's
 * pull (`reach`) is refused before anything, the cache included, when its registry is not one a
 * tenant may reach (src/registry/reach.ts), and its every connection is checked again.
 */
import { chmod, mkdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { createHash } from "node:crypto";
import { dirname, join } from "node:path";
import { z } from "zod";
import { clientFor } from "../registry/index.js";
import type { RegistryClient, RegistrySettings } from "../registry/index.js";
import { assertReachable, tenantGuard } from "../registry/index.js";
import type { Reach } from "../registry/index.js";
import { reference } from "../registry/index.js";
import type { Progress } from "../util/index.js";
import { fsyncDir } from "../util/index.js";
import { ForkdError } from "../util/index.js";
import { run } from "../util/index.js";
import { CACHE_DIR_MODE, ImageCache } from "./cache.js";
import { parseImageConfig } from "./config.js";
import { fetchLayer, fetchSmallBlob, storeBlob } from "./fetch.js";
import { flattenLayers } from "./flatten.js";
import type { FlattenLimits } from "./flatten.js";
import type { PulledImage } from "./image.js";
import { DEFAULT_LIMITS } from "./limits.js";
import {
  MANIFEST_ACCEPT,
  MAX_CONFIG_BYTES,
  MAX_MANIFEST_BYTES,
  layerCompression,
  parseManifestOrIndex,
  selectPlatform,
} from "./manifest.js";
import type { ImageManifest } from "./manifest.js";
import { parseImageRef } from "./ref.js";
import type { ImageRef } from "./ref.js";

export interface ImagePullerOptions {
  /** The cache root (the daemon's image cache); images live under `<cacheDir>/oci/`. */
  cacheDir: string;
  /** The registry settings push and pull use (credentials, insecure hosts, idle timeout). */
  settings: RegistrySettings;
  limits?: FlattenLimits;
}

const record = z.object({
  digest: z.string().max(80),
  config: z.object({
    env: z.array(z.string()).max(4096),
    workingDir: z.string().nullable(),
    user: z.string().nullable(),
    entrypoint: z.array(z.string()).max(4096).nullable(),
    cmd: z.array(z.string()).max(4096).nullable(),
    labels: z.record(z.string(), z.string()),
  }),
  sizeBytes: z.number().int().nonnegative(),
});
type CachedImage = z.infer<typeof record>;

/** A pull in progress, and the signal of the caller that started it. */
interface Flight<T> {
  p: Promise<T>;
  signal: AbortSignal | undefined;
}

const aborted = (signal?: AbortSignal) => {
  if (signal?.aborted) {
    throw signal.reason instanceof Error
      ? signal.reason
      : new ForkdError("timeout", "the pull was cancelled");
  }
};

/** `p`, or the signal's reason as soon as it is aborted (a caller that joined someone's pull). */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return p;
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      reject(
        signal.reason instanceof Error ? signal.reason : new ForkdError("timeout", "the pull was cancelled"),
      );
    };
    if (signal.aborted) return onAbort();
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

export class ImagePuller {
  private readonly cache: ImageCache;
  private readonly limits: FlattenLimits;
  private readonly flights = new Map<string, Flight<unknown>>();
  private ready: Promise<void> | null = null;

  constructor(private readonly o: ImagePullerOptions) {
    this.cache = new ImageCache(o.cacheDir);
    this.limits = o.limits ?? DEFAULT_LIMITS;
  }

  /** Where the cache is (`<cacheDir>/oci`). */
  get dir(): string {
    return this.cache.dir;
  }

  /**
   * One run of `fn` per key at a time: a second caller waits for the first's result. When the
   * run fails because the caller that started it cancelled (its signal), a caller that did not
   * cancel starts it again rather than fail with someone else's cancellation.
   */
  private async once<T>(key: string, signal: AbortSignal | undefined, fn: () => Promise<T>): Promise<T> {
    for (;;) {
      let f = this.flights.get(key) as Flight<T> | undefined;
      if (!f) {
        const p = fn().finally(() => this.flights.delete(key));
        f = { p, signal };
        this.flights.set(key, f);
      }
      try {
        return await (f.signal === signal ? f.p : untilAborted(f.p, signal));
      } catch (e) {
        if (f.signal !== signal && f.signal?.aborted && !signal?.aborted) continue;
        throw e;
      }
    }
  }

  private init(): Promise<void> {
    this.ready ??= this.cache
      .init()
      .then(() => this.cache.sweep())
      .catch((e: unknown) => {
        this.ready = null; // tried again by the next ensure()
        throw e;
      });
    return this.ready;
  }

  /** Refuses `ref` if `reach` may not pull from its registry (before any request or cache hit). */
  async admit(ref: string, reach: Reach): Promise<void> {
    if (reach !== "tenant") return;
    const r = parseImageRef(ref);
    const guard = this.o.settings.tenant ?? tenantGuard([]);
    await assertReachable(new URL(`https://${r.apiHost}/`), guard, `image ${r.normalized}`);
  }

  async ensure(
    ref: string,
    progress: Progress = () => undefined,
    signal?: AbortSignal,
    reach: Reach = "operator",
  ): Promise<PulledImage> {
    const r = parseImageRef(ref);
    await this.admit(ref, reach);
    await this.init();
    const client = clientFor(r, this.o.settings, { insecure: false, push: false, reach });
    progress(`resolving ${r.normalized}`, { phase: "manifest" });
    const top = await this.manifestBytes(client, r, reference(r), null);
    aborted(signal);
    let parsed = parseManifestOrIndex(top.bytes, top.mediaType, r.normalized);
    let digest = top.digest;
    if (parsed.kind === "index") {
      const pick = selectPlatform(parsed.index, r.normalized);
      const m = await this.manifestBytes(client, r, pick.digest, pick.size);
      parsed = parseManifestOrIndex(m.bytes, m.mediaType, `${r.normalized}@${pick.digest}`);
      if (parsed.kind !== "manifest") {
        throw new ForkdError(
          "invalid_argument",
          `${r.normalized}: the index's linux/amd64 entry is another index`,
        );
      }
      digest = m.digest;
    }
    const manifest = parsed.manifest;
    const cached = await this.cached(digest);
    if (cached) return this.pulled(r, digest, cached);
    const made = await this.once(`image:${digest}`, signal, () =>
      this.pull(client, r, digest, manifest, progress, signal),
    );
    return this.pulled(r, digest, made);
  }

  private pulled(r: ImageRef, digest: string, c: CachedImage): PulledImage {
    return {
      ref: r.normalized,
      digest,
      rootfs: join(this.cache.rootfs(digest), "tree"),
      config: c.config,
      sizeBytes: c.sizeBytes,
    };
  }

  private async cached(digest: string): Promise<CachedImage | null> {
    let raw: string;
    try {
      raw = await readFile(join(this.cache.rootfs(digest), "image.json"), "utf8");
    } catch {
      return null;
    }
    let j: unknown;
    try {
      j = JSON.parse(raw);
    } catch {
      j = null;
    }
    const r = record.safeParse(j);
    if (!r.success || r.data.digest !== digest) {
      throw new ForkdError(
        "image_error",
        `the cached image ${digest} has a bad image.json (remove ${this.cache.rootfs(digest)})`,
      );
    }
    return r.data;
  }

  /** A manifest by digest from the cache, else from the registry (then cached); a tag always asks. */
  private async manifestBytes(
    client: RegistryClient,
    r: ImageRef,
    ref: string,
    size: number | null,
  ): Promise<{ bytes: Buffer; mediaType: string; digest: string }> {
    const byDigest = ref.startsWith("sha256:");
    if (byDigest) {
      const bytes = await readFile(this.cache.blob(ref)).catch(() => null);
      if (bytes && `sha256:${createHash("sha256").update(bytes).digest("hex")}` === ref) {
        return { bytes, mediaType: "", digest: ref };
      }
    }
    const m = await client.getManifest(
      ref,
      MANIFEST_ACCEPT,
      Math.min(size ?? MAX_MANIFEST_BYTES, MAX_MANIFEST_BYTES),
    );
    if (size !== null && m.bytes.length !== size) {
      throw new ForkdError(
        "invalid_argument",
        `${r.normalized}: manifest ${ref} is ${m.bytes.length} bytes, its index says ${size}`,
      );
    }
    await storeBlob(this.cache.blob(m.digest), m.bytes);
    return m;
  }

  private async pull(
    client: RegistryClient,
    r: ImageRef,
    digest: string,
    manifest: ImageManifest,
    progress: Progress,
    signal?: AbortSignal,
  ): Promise<CachedImage> {
    const what = `${r.normalized}@${digest}`;
    // The config: platform, diff_ids, runtime settings.
    let configBytes: Buffer | null = await readFile(this.cache.blob(manifest.config.digest)).catch(
      () => null,
    );
    if (!configBytes) {
      configBytes = await fetchSmallBlob(
        client,
        manifest.config.digest,
        manifest.config.size,
        MAX_CONFIG_BYTES,
        `${what}: config`,
      );
      await storeBlob(this.cache.blob(manifest.config.digest), configBytes);
    }
    const cfg = parseImageConfig(configBytes, what);
    if (
      (cfg.platform.os && cfg.platform.os !== "linux") ||
      (cfg.platform.architecture && cfg.platform.architecture !== "amd64")
    ) {
      throw new ForkdError(
        "invalid_argument",
        `${what}: the image is for ${cfg.platform.os}/${cfg.platform.architecture}, not linux/amd64`,
      );
    }
    if (cfg.diffIds.length !== manifest.layers.length) {
      throw new ForkdError(
        "invalid_argument",
        `${what}: the manifest has ${manifest.layers.length} layers, the config ${cfg.diffIds.length} diff_ids`,
      );
    }
    const layers = manifest.layers.map((l, i) => ({
      ...l,
      compression: layerCompression(l.mediaType),
      diffId: cfg.diffIds[i] ?? "",
      index: i + 1,
    }));
    // Pull: every layer not in the cache, one after the other.
    const count = layers.length;
    const total = layers.reduce((a, l) => a + l.size, 0);
    let done = 0;
    /** The image's layers, uncompressed, may add up to the byte bound (as its tree may). */
    let budget = this.limits.maxBytes;
    const over = (l: { index: number; digest: string }) =>
      new ForkdError(
        "payload_too_large",
        `${what}: layer ${l.index}/${count} (${l.digest}): the image's layers add up to more than ${this.limits.maxBytes} bytes`,
        { limit_bytes: this.limits.maxBytes },
      );
    for (const l of layers) {
      aborted(signal);
      const dest = this.cache.layer(l.diffId);
      const info = { index: l.index, count, path: l.digest };
      const have = await stat(dest).catch(() => null);
      if (have) {
        budget -= have.size;
        if (budget < 0) throw over(l);
      } else if (l.size > budget) {
        throw over(l);
      }
      if (!have) {
        progress(`pulling layer ${l.index}/${count} (${l.size} bytes)`, {
          phase: "pull",
          layer: info,
          done_bytes: done,
          total_bytes: total,
        });
        const start = done;
        let last = 0;
        await this.once(`layer:${l.diffId}`, signal, () =>
          fetchLayer({
            client,
            digest: l.digest,
            size: l.size,
            compression: l.compression,
            diffId: l.diffId,
            maxBytes: budget,
            tmp: this.cache.tmp("layer"),
            dest,
            what: `${what}: layer ${l.index}/${count} (${l.digest})`,
            onBytes: (n) => {
              done += n;
              if (done - last >= 8 << 20) {
                last = done;
                progress(`pulling layer ${l.index}/${count}`, {
                  phase: "pull",
                  layer: info,
                  done_bytes: done,
                  total_bytes: total,
                });
              }
            },
            ...(signal ? { signal } : {}),
          }),
        );
        done = start + l.size;
        budget -= (await stat(dest)).size;
      } else {
        done += l.size;
      }
      progress(`layer ${l.index}/${count} ready`, {
        phase: "pull",
        layer: info,
        done_bytes: done,
        total_bytes: total,
      });
    }
    // Flatten into a staging directory, then rename it into place.
    const staging = this.cache.tmp("rootfs");
    const tree = join(staging, "tree");
    try {
      // The staging directory (rootfs/sha256/<hex> once renamed) is 0700; the tree inside it
      // gets the image's own root mode (flatten), reachable only through it.
      await mkdir(staging, { mode: CACHE_DIR_MODE });
      await chmod(staging, CACHE_DIR_MODE);
      await mkdir(tree, { mode: 0o755 });
      const layerFiles = await Promise.all(
        layers.map(async (l) => ({
          path: this.cache.layer(l.diffId),
          digest: l.diffId,
          size: (await stat(this.cache.layer(l.diffId))).size,
        })),
      );
      const res = await flattenLayers({
        root: tree,
        layers: layerFiles,
        limits: this.limits,
        progress,
        ...(signal ? { signal } : {}),
      });
      const rec: CachedImage = { digest, config: cfg.config, sizeBytes: res.sizeBytes };
      await writeFile(
        join(staging, "image.json"),
        JSON.stringify({ ...rec, ref: r.normalized }, null, 2) + "\n",
        { mode: 0o444 },
      );
      aborted(signal);
      await run("sync", ["-f", staging], { timeoutMs: 600_000 });
      const final = this.cache.rootfs(digest);
      try {
        await rename(staging, final);
        await fsyncDir(dirname(final));
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code !== "ENOTEMPTY" && code !== "EEXIST") throw e;
        // Another process made it first: theirs is as good as ours.
        await rm(staging, { recursive: true, force: true });
      }
      return rec;
    } catch (e) {
      await rm(staging, { recursive: true, force: true });
      throw e;
    }
  }
}
