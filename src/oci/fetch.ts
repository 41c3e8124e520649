/**
 * Fetching into the image cache: small blobs (manifests, configs) read whole and bounded, and
 * layers streamed from the registry through their decompressor into an uncompressed tar,
 * verified on the way twice (the blob against its digest and size, the tar against the
 * config's diff_id), bounded in size, fsynced, then renamed into place. Whatever fails, the
 * temporary file is removed: the cache holds only complete, verified layers.
 */
import { createHash } from "node:crypto";
import { createWriteStream } from "node:fs";
import { open, rename, rm } from "node:fs/promises";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { RegistryClient } from "../registry/index.js";
import { fsyncDir, writeFileAtomic } from "../util/index.js";
import { ForkdError } from "../util/index.js";
import { dirname } from "node:path";
import { decompressor } from "./decompress.js";
import type { Compression } from "./manifest.js";

/** A blob of at most `max` bytes, read whole and verified (openBlob checks digest and size). */
export async function fetchSmallBlob(
  client: RegistryClient,
  digest: string,
  size: number,
  max: number,
  what: string,
): Promise<Buffer> {
  if (size > max)
    throw new ForkdError("invalid_argument", `${what} ${digest} is ${size} bytes (at most ${max})`);
  const s = await client.openBlob(digest, size);
  const parts: Buffer[] = [];
  for await (const c of s as AsyncIterable<Buffer>) parts.push(c);
  return Buffer.concat(parts);
}

export interface LayerFetch {
  client: RegistryClient;
  digest: string;
  size: number;
  compression: Compression;
  diffId: string;
  /** The uncompressed tar may be at most this large. */
  maxBytes: number;
  tmp: string;
  dest: string;
  what: string;
  /** Compressed bytes received (for progress). */
  onBytes?: (n: number) => void;
  signal?: AbortSignal;
}

/** Fetches, decompresses and verifies one layer into `dest`. */
export async function fetchLayer(o: LayerFetch): Promise<void> {
  const body = await o.client.openBlob(o.digest, o.size);
  const counter = new Transform({
    transform(chunk: Buffer, _e, cb) {
      o.onBytes?.(chunk.length);
      cb(null, chunk);
    },
  });
  const h = createHash("sha256");
  let out = 0;
  const check = new Transform({
    transform(chunk: Buffer, _e, cb) {
      out += chunk.length;
      if (out > o.maxBytes) {
        return cb(
          new ForkdError(
            "payload_too_large",
            `${o.what}: the layer expands to more than ${o.maxBytes} bytes`,
            { limit_bytes: o.maxBytes },
          ),
        );
      }
      h.update(chunk);
      cb(null, chunk);
    },
  });
  try {
    await pipeline(
      body,
      counter,
      decompressor(o.compression, o.what),
      check,
      createWriteStream(o.tmp, { flags: "wx", mode: 0o444 }),
      o.signal ? { signal: o.signal } : {},
    );
    const got = `sha256:${h.digest("hex")}`;
    if (got !== o.diffId) {
      throw new ForkdError(
        "invalid_argument",
        `${o.what}: the uncompressed layer is ${got}, the image config says ${o.diffId}`,
      );
    }
    const fh = await open(o.tmp, "r");
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(o.tmp, o.dest);
    await fsyncDir(dirname(o.dest));
  } catch (e) {
    body.destroy();
    await rm(o.tmp, { force: true });
    // A cancelled pull fails with the canceller's reason, not the pipeline's AbortError.
    const reason: unknown = o.signal?.aborted ? o.signal.reason : undefined;
    throw reason instanceof Error ? reason : e;
  }
}

/** Stores verified bytes under their digest (atomic). */
export async function storeBlob(path: string, bytes: Buffer): Promise<void> {
  await writeFileAtomic(path, bytes, 0o444);
}
