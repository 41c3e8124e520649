/**
 * Pull: a snapshot from an OCI registry (an artifact written by push.ts) or from a pack file at
 * an https URL (http only on loopback or with --insecure).
 *
 * From a registry: the manifest (bounded, media types and layer paths checked before anything
 * else: artifact.ts) and its config (the pack manifest) are read first. Files this host already
 * has are not downloaded: those registration will not need (the guest image when installed, the
 * files of a chain snapshot that is here: pack.ts presentHere) and memory or device-state files
 * with the sha256 of a local one (linked). Every other file is downloaded into a staging
 * directory, verified against its blob digest and size as it streams, and decompressed to
 * exactly the listed size. The staging
 * directory then goes through the same verification and registration as an unpacked pack
 * (pack.ts registerStaged). Nothing is left staged, whatever happens.
 */
import { mkdir, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { Transform } from "node:stream";
import { buffer } from "node:stream/consumers";
import { clientFor } from "../registry/index.js";
import { formatRef, parseRef, reference } from "../registry/index.js";
import { bodyStream, checkScheme, discard, send } from "../registry/index.js";
import { ForkdError } from "../util/index.js";
import { linkOrCopy } from "../util/index.js";
import { assertKey } from "../util/index.js";
import { visibleTo } from "./namespace.js";
import {
  ANNOTATION,
  MAX_CONFIG_BYTES,
  MAX_MANIFEST_BYTES,
  MEDIA,
  checkLayersAgainst,
  parseManifest,
} from "./artifact.js";
import { decompressTo } from "./blobs.js";
import { mapPackError, parsePackManifest, presentHere, registerStaged, stagingName } from "./pack.js";
import type { PackManifest, UnpackDeps } from "./pack.js";
import { overLimit } from "./unpack-budget.js";
import { limitFor, unpackSnapshot } from "./unpack.js";
import { memoryDiffFile } from "./store.js";
import type { TransferDeps } from "./push.js";
import type { Progress } from "../util/index.js";

/** A pack fetched from a URL is at most this large. */
const MAX_PACK_BYTES = 256 * 2 ** 30;

export interface PullRequest {
  ref?: string;
  url?: string;
  /** Register the pulled snapshot (the top of its chain) under this tag. */
  tag?: string;
  insecure: boolean;
}

export interface PullResult {
  tag: string;
  published: string[];
  source: string;
  digest: string | null;
  blobs: { total: number; downloaded: number; reused: number };
  bytes: { downloaded: number };
}

export async function pullSnapshot(
  deps: TransferDeps & UnpackDeps,
  req: PullRequest,
  progress: Progress = () => undefined,
): Promise<PullResult> {
  if ((req.ref === undefined) === (req.url === undefined)) {
    throw new ForkdError("invalid_argument", "give exactly one of ref and url");
  }
  if (req.tag !== undefined) assertKey(req.tag);
  try {
    return await (req.url !== undefined
      ? pullUrl(deps, req.url, req, progress)
      : pullRef(deps, req.ref ?? "", req, progress));
  } catch (e) {
    throw mapPackError(e);
  }
}

async function pullUrl(
  deps: UnpackDeps,
  text: string,
  req: PullRequest,
  progress: Progress,
): Promise<PullResult> {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new ForkdError("invalid_argument", `not a URL: ${JSON.stringify(text.slice(0, 200))}`, {
      field: "url",
    });
  }
  if (url.username || url.password) {
    throw new ForkdError("invalid_argument", "a pack URL must not carry credentials", { field: "url" });
  }
  const policy = { insecure: req.insecure };
  checkScheme(url, policy);
  const s = await send(url, {
    method: "GET",
    policy,
    idleMs: 120_000,
    what: `GET ${url.origin}${url.pathname}`,
  });
  if (s.res.status !== 200) {
    await discard(s);
    throw new ForkdError(
      s.res.status === 404 ? "not_found" : "unavailable",
      `${url.origin}${url.pathname} answered ${s.res.status}`,
      {
        status: s.res.status,
      },
    );
  }
  const declared = Number(s.res.headers.get("content-length") ?? "0");
  if (declared > MAX_PACK_BYTES) {
    await discard(s);
    throw new ForkdError("invalid_argument", `the pack is larger than ${MAX_PACK_BYTES} bytes`);
  }
  let seen = 0;
  const bound = new Transform({
    transform(chunk: Buffer, _e, cb) {
      seen += chunk.length;
      if (seen > MAX_PACK_BYTES)
        return cb(new ForkdError("invalid_argument", `the pack is larger than ${MAX_PACK_BYTES} bytes`));
      cb(null, chunk);
    },
  });
  progress(`downloading ${url.origin}${url.pathname}`, {
    phase: "receive",
    done_bytes: 0,
    ...(declared > 0 ? { total_bytes: declared } : {}),
  });
  const body = bodyStream(s);
  body.on("error", (e) => bound.destroy(e));
  const r = await unpackSnapshot(deps, body.pipe(bound), {
    ...(req.tag !== undefined ? { as: req.tag } : {}),
    progress,
    ...(declared > 0 ? { totalBytes: declared } : {}),
  });
  progress(`${r.tag} ready (registered: ${r.published.join(", ") || "nothing new"})`, { phase: "register" });
  return {
    ...r,
    source: `${url.origin}${url.pathname}`,
    digest: null,
    blobs: { total: 1, downloaded: 1, reused: 0 },
    bytes: { downloaded: seen },
  };
}

async function pullRef(
  deps: TransferDeps & UnpackDeps,
  text: string,
  req: PullRequest,
  progress: Progress,
): Promise<PullResult> {
  const ref = parseRef(text);
  const client = clientFor(ref, deps.registry, { insecure: req.insecure, push: false });
  progress(`reading the manifest of ${formatRef(ref)}`, { phase: "manifest" });
  const got = await client.getManifest(reference(ref), [MEDIA.manifest], MAX_MANIFEST_BYTES);
  const manifest = parseManifest(got.bytes, got.mediaType);
  const configBytes = await buffer(await client.openBlob(manifest.config.digest, manifest.config.size));
  if (configBytes.length > MAX_CONFIG_BYTES)
    throw new ForkdError("invalid_argument", "config blob too large");
  const pack = parsePackManifest(configBytes.toString("utf8"));
  checkLayersAgainst(manifest, pack);
  await checkSpace(deps, pack);

  const dir = deps.store.stagingDir(stagingName("pull"));
  const result: PullResult = {
    tag: pack.tag,
    published: [],
    source: formatRef(ref),
    digest: got.digest,
    blobs: { total: manifest.layers.length, downloaded: 0, reused: 0 },
    bytes: { downloaded: 0 },
  };
  try {
    await mkdir(dir, { mode: 0o700 });
    await writeFile(join(dir, "manifest.json"), configBytes, { mode: 0o600 });
    const skip = await presentHere(deps, pack, req.tag);
    const local = await localFiles(deps);
    // Compressed bytes of every layer: a layer here already counts as done.
    const totalBytes = manifest.layers.reduce((a, l) => a + l.size, 0);
    let doneBytes = 0;
    let n = 0;
    for (const l of manifest.layers) {
      n++;
      const path = l.annotations[ANNOTATION.path];
      const size = Number(l.annotations[ANNOTATION.size]);
      const out = join(dir, path);
      await mkdir(dirname(out), { recursive: true, mode: 0o700 });
      const have = local.get(l.annotations[ANNOTATION.sha256]);
      if (skip.has(path) || have) {
        if (!skip.has(path) && have) await linkOrCopy(have, out);
        result.blobs.reused++;
        doneBytes += l.size;
        progress(`[${n}/${manifest.layers.length}] ${path}: here already`, {
          phase: "download",
          layer: { index: n, count: manifest.layers.length, path },
          done_bytes: doneBytes,
          total_bytes: totalBytes,
        });
        continue;
      }
      await decompressTo(await client.openBlob(l.digest, l.size), out, size);
      result.blobs.downloaded++;
      result.bytes.downloaded += l.size;
      doneBytes += l.size;
      progress(
        `[${n}/${manifest.layers.length}] ${path}: downloaded (${(l.size / 2 ** 20).toFixed(1)} MiB)`,
        {
          phase: "download",
          layer: { index: n, count: manifest.layers.length, path },
          done_bytes: doneBytes,
          total_bytes: totalBytes,
        },
      );
    }
    progress("verifying and registering the chain", { phase: "register" });
    const r = await registerStaged(deps, dir, {
      allowPresent: true,
      ...(req.tag !== undefined ? { as: req.tag } : {}),
    });
    progress(`${r.tag} ready (registered: ${r.published.join(", ") || "nothing new"})`, {
      phase: "register",
    });
    return { ...result, ...r };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * Refuses a pull past the unpack limit (FORKD_UNPACK_MAX_MIB) or that would not fit (with a
 * margin) on the data directory's filesystem, before anything is downloaded: every file is
 * then decompressed to exactly its listed size (blobs.ts decompressTo), so the listed sizes
 * bound what the pull writes.
 */
async function checkSpace(deps: UnpackDeps, pack: PackManifest): Promise<void> {
  const need = Object.values(pack.files).reduce((a, f) => a + f.size, 0);
  const limit = await limitFor(deps);
  if (need > limit.bytes) throw overLimit(limit, need);
}

/**
 * Memory images and device states this host has, by sha256 (their snapshots' metadata records
 * the hashes; registration hashes them again): a branch's memory is often its sibling's.
 */
async function localFiles(deps: UnpackDeps): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  for (const m of await deps.store.list()) {
    // Only what the caller may see: whether another tenant has some content is not its to learn.
    if (!visibleTo(deps.viewer ?? null, m.tag, m.owner)) continue;
    const f = deps.store.filesFor(m.tag);
    // A diff snapshot's own memory is its diff (files.memory is its base's, listed there).
    if (m.files.memoryDiff) out.set(m.files.memoryDiff.sha256, memoryDiffFile(f.dir));
    else out.set(m.files.memory.sha256, f.memory);
    out.set(m.files.vmstate.sha256, f.vmstate);
  }
  return out;
}
