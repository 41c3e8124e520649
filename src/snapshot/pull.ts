/**
 * Pull: a snapshot from an OCI registry (an artifact written by push.ts) or from a pack file at
 * an https URL (http only on loopback or with --insecure).
 *
 * From a registry: the manifest (bounded, media types and layer paths checked before anything
 * else: artifact.ts) and its config (the pack manifest) are read first. Then the loop every pull
 * of a chain's files shares (staged-pull.ts: what this node has is not downloaded, the rest is
 * staged and verified, then registered as an unpacked pack is: register.ts), each file a blob
 * verified against its digest and size as it streams and decompressed to exactly the listed
 * size. A pull from peers of the cluster goes through the same loop (peer-pull.ts).
 */
import { Transform } from "node:stream";
import { buffer } from "node:stream/consumers";
import { clientFor } from "../registry/index.js";
import { formatRef, parseRef, reference } from "../registry/index.js";
import { bodyStream, checkScheme, discard, send } from "../registry/index.js";
import { ForkdError } from "../util/index.js";
import { assertKey } from "../util/index.js";
import {
  ANNOTATION,
  MAX_CONFIG_BYTES,
  MAX_MANIFEST_BYTES,
  MEDIA,
  checkLayersAgainst,
  parseManifest,
} from "./artifact.js";
import { decompressTo } from "./blobs.js";
import { mapPackError, parsePackManifest } from "./pack.js";
import type { UnpackDeps } from "./pack.js";
import type { RegisterOptions } from "./register.js";
import { pullStaged } from "./staged-pull.js";
import { unpackSnapshot } from "./unpack.js";
import type { TransferDeps } from "./push.js";
import type { Progress } from "../util/index.js";

/** A pack fetched from a URL is at most this large. */
const MAX_PACK_BYTES = 256 * 2 ** 30;

export interface PullRequest {
  ref?: string;
  url?: string;
  /**
   * Peer nodes' URLs (holders, best first): `tag` is then the key pulled from them (the snapshot
   * service's pullFromPeers).
   */
  peer?: string | string[];
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
  /** Bytes received over the wire (a registry's compressed blobs), in all and per file downloaded. */
  bytes: { downloaded: number; files?: { path: string; bytes: number }[] };
}

export async function pullSnapshot(
  deps: TransferDeps & UnpackDeps,
  req: PullRequest,
  progress: Progress = () => undefined,
): Promise<PullResult> {
  if ((req.ref === undefined) === (req.url === undefined) || req.peer !== undefined) {
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

/**
 * Pulls the artifact at `ref` pinned by its manifest `digest` (so every blob is the one pushed)
 * and registers its chain under the cluster's `keys` and `owners` (root first): a node fetching
 * a snapshot no live peer holds from the registry a peer pushed it to (src/cluster/ensure.ts).
 * An admin's registration only (deps.viewer null).
 */
export async function pullPinned(
  deps: TransferDeps & UnpackDeps,
  p: { ref: string; digest: string; insecure: boolean; keys: string[]; owners: (string | null)[] },
  progress: Progress = () => undefined,
): Promise<PullResult> {
  const ref = parseRef(p.ref);
  const pinned = formatRef({ ...ref, tag: null, digest: p.digest });
  try {
    return await pullRef(deps, pinned, { insecure: p.insecure }, progress, {
      keys: { keys: p.keys, owners: p.owners },
    });
  } catch (e) {
    throw mapPackError(e);
  }
}

async function pullRef(
  deps: TransferDeps & UnpackDeps,
  text: string,
  req: Pick<PullRequest, "tag" | "insecure">,
  progress: Progress,
  register: RegisterOptions = req.tag !== undefined ? { as: req.tag } : {},
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
  const digests = new Map(manifest.layers.map((l) => [l.annotations[ANNOTATION.path], l]));
  const r = await pullStaged(
    deps,
    {
      manifest: pack,
      files: manifest.layers.map((l) => ({
        path: l.annotations[ANNOTATION.path],
        size: Number(l.annotations[ANNOTATION.size]),
        sha256: l.annotations[ANNOTATION.sha256],
        wire: l.size,
      })),
      // Each blob verified against its digest and size as it streams, and decompressed to
      // exactly the listed size (the registration then checks the file's sha256).
      fetch: async (f, out) => {
        const l = digests.get(f.path);
        if (!l) throw new ForkdError("internal", `no layer for ${f.path}`);
        await decompressTo(await client.openBlob(l.digest, l.size), out, f.size);
        return { wire: l.size, sum: { size: f.size, sha256: f.sha256 }, hashed: false };
      },
      register,
      what: "pull",
    },
    progress,
  );
  return {
    tag: r.tag,
    published: r.published,
    source: formatRef(ref),
    digest: got.digest,
    blobs: r.files,
    bytes: r.bytes,
  };
}
