/**
 * A snapshot as an OCI artifact: an image manifest whose config blob is the pack manifest
 * (pack.ts: chain, image, sha256 and size of every file) and whose layers are the pack's files,
 * one zstd blob each, annotated with the file's path in the pack and its uncompressed sha256
 * and size. See docs/snapshot-format.md, "Registries".
 *
 * A manifest read from a registry is checked here before anything is downloaded: media types,
 * sizes, every layer path a place a pack has a file, one layer per file the config lists.
 */
import { z } from "zod";
import { ForkdError } from "../util/index.js";
import { isPackPath } from "./pack.js";
import type { PackManifest } from "./pack.js";

export const MEDIA = {
  manifest: "application/vnd.oci.image.manifest.v1+json",
  artifact: "application/vnd.forkd.snapshot.v1",
  config: "application/vnd.forkd.snapshot.config.v1+json",
  layer: "application/vnd.forkd.snapshot.file.v1+zstd",
} as const;

export const ANNOTATION = {
  path: "vnd.forkd.file.path",
  sha256: "vnd.forkd.file.sha256",
  size: "vnd.forkd.file.size",
  tag: "vnd.forkd.snapshot.tag",
  created: "org.opencontainers.image.created",
} as const;

/** Bounds on what a registry may hand us before anything is downloaded. */
export const MAX_MANIFEST_BYTES = 4 << 20;
export const MAX_CONFIG_BYTES = 16 << 20;
const MAX_LAYERS = 4096;
/** A blob is at most this much larger than its content (zstd's worst case is far below). */
const maxCompressed = (size: number) => size + (size >> 7) + (1 << 16);

const Digest = z.string().regex(/^sha256:[0-9a-f]{64}$/);
const Size = z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER);

const Layer = z.object({
  mediaType: z.literal(MEDIA.layer),
  digest: Digest,
  size: Size,
  annotations: z.object({
    [ANNOTATION.path]: z.string().max(256),
    [ANNOTATION.sha256]: z.string().regex(/^[0-9a-f]{64}$/),
    [ANNOTATION.size]: z.string().regex(/^\d{1,16}$/),
  }),
});

const OciManifest = z.object({
  schemaVersion: z.literal(2),
  mediaType: z.literal(MEDIA.manifest),
  artifactType: z.literal(MEDIA.artifact),
  config: z.object({
    mediaType: z.literal(MEDIA.config),
    digest: Digest,
    size: Size.max(MAX_CONFIG_BYTES),
  }),
  layers: z.array(Layer).min(1).max(MAX_LAYERS),
  annotations: z.record(z.string(), z.string()).optional(),
});
export type OciManifest = z.infer<typeof OciManifest>;
export type OciLayer = z.infer<typeof Layer>;

export interface Descriptor {
  digest: string;
  size: number;
}

/** The manifest of a push: the config and one layer per file, in the pack manifest's order. */
export function buildManifest(
  pack: PackManifest,
  config: Descriptor,
  blobs: Map<string, Descriptor>,
): Buffer {
  const layers: OciLayer[] = Object.entries(pack.files).map(([path, sum]) => {
    const b = blobs.get(path);
    if (!b) throw new ForkdError("internal", `no blob for ${path}`);
    return {
      mediaType: MEDIA.layer,
      digest: b.digest,
      size: b.size,
      annotations: {
        [ANNOTATION.path]: path,
        [ANNOTATION.sha256]: sum.sha256,
        [ANNOTATION.size]: String(sum.size),
      },
    };
  });
  const m: OciManifest = {
    schemaVersion: 2,
    mediaType: MEDIA.manifest,
    artifactType: MEDIA.artifact,
    config: { mediaType: MEDIA.config, ...config },
    layers,
    annotations: { [ANNOTATION.tag]: pack.tag, [ANNOTATION.created]: pack.created },
  };
  return Buffer.from(JSON.stringify(m));
}

const refuse = (why: string) =>
  new ForkdError("invalid_argument", `not a forkd snapshot artifact: ${why}`, { reason: why });

/** Parses and checks a manifest from a registry (`mediaType`: its Content-Type). */
export function parseManifest(bytes: Buffer, mediaType: string): OciManifest {
  if (bytes.length > MAX_MANIFEST_BYTES) throw refuse("the manifest is too large");
  if (mediaType && mediaType !== MEDIA.manifest) throw refuse(`media type ${JSON.stringify(mediaType)}`);
  let json: unknown;
  try {
    json = JSON.parse(bytes.toString("utf8"));
  } catch {
    throw refuse("the manifest is not JSON");
  }
  const r = OciManifest.safeParse(json);
  if (!r.success) {
    const i = r.error.issues[0];
    throw refuse(`${i?.path.join(".") || "(root)"}: ${i?.message ?? "invalid"}`);
  }
  const seen = new Set<string>();
  for (const l of r.data.layers) {
    const p = l.annotations[ANNOTATION.path];
    if (p === "manifest.json" || !isPackPath(p, false)) throw refuse(`layer path ${JSON.stringify(p)}`);
    if (seen.has(p)) throw refuse(`two layers for ${p}`);
    seen.add(p);
    if (l.size > maxCompressed(Number(l.annotations[ANNOTATION.size]))) {
      throw refuse(`layer ${p} is larger than its content could compress to`);
    }
  }
  return r.data;
}

/** The config (pack manifest) and the layers must describe the same files. */
export function checkLayersAgainst(m: OciManifest, pack: PackManifest): void {
  const files = Object.entries(pack.files);
  if (files.length !== m.layers.length) throw refuse("layers and config list different files");
  for (const l of m.layers) {
    const sum = pack.files[l.annotations[ANNOTATION.path]];
    if (
      !sum ||
      sum.sha256 !== l.annotations[ANNOTATION.sha256] ||
      String(sum.size) !== l.annotations[ANNOTATION.size]
    ) {
      throw refuse(`layer ${l.annotations[ANNOTATION.path]} does not match the config`);
    }
  }
}
