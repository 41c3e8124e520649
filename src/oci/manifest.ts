/**
 * Image manifests and indexes, OCI and Docker v2 (schema 2): their media types, zod schemas
 * (bounded), the layer compressions supported, and which manifest of an index or Docker
 * manifest list is ours (linux/amd64).
 */
import { z } from "zod";
import { DIGEST_RE } from "../registry/index.js";
import { ForkdError } from "../util/index.js";

export const MEDIA = {
  ociManifest: "application/vnd.oci.image.manifest.v1+json",
  ociIndex: "application/vnd.oci.image.index.v1+json",
  ociConfig: "application/vnd.oci.image.config.v1+json",
  dockerManifest: "application/vnd.docker.distribution.manifest.v2+json",
  dockerList: "application/vnd.docker.distribution.manifest.list.v2+json",
  dockerConfig: "application/vnd.docker.container.image.v1+json",
} as const;

/** What a manifest GET accepts, in order of preference. */
export const MANIFEST_ACCEPT = [MEDIA.ociIndex, MEDIA.dockerList, MEDIA.ociManifest, MEDIA.dockerManifest];

/** A manifest or an index is at most this large. */
export const MAX_MANIFEST_BYTES = 4 << 20;
/** An image config is at most this large. */
export const MAX_CONFIG_BYTES = 4 << 20;
/** Layers an image may have (Docker's own bound is 127). */
export const MAX_LAYERS = 256;

export type Compression = "gzip" | "zstd" | "none";

const LAYER_MEDIA: Record<string, Compression> = {
  "application/vnd.oci.image.layer.v1.tar": "none",
  "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
  "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
  "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
  "application/vnd.docker.image.rootfs.diff.tar": "none",
  "application/vnd.docker.image.rootfs.diff.tar.zstd": "zstd",
};

/** The compression of a layer media type; foreign and unknown layers are refused. */
export function layerCompression(mediaType: string): Compression {
  const c = LAYER_MEDIA[mediaType];
  if (!c) {
    throw new ForkdError(
      "invalid_argument",
      `image layer media type ${JSON.stringify(mediaType.slice(0, 200))} is not supported (tar, tar+gzip, tar+zstd)`,
    );
  }
  return c;
}

const digest = z.string().regex(DIGEST_RE, "sha256:<64 hex digits>");
const descriptor = z.object({
  mediaType: z.string().max(256),
  digest,
  size: z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER),
});

export const manifestSchema = z.object({
  schemaVersion: z.literal(2),
  mediaType: z.string().max(256).optional(),
  config: descriptor,
  layers: z.array(descriptor).max(MAX_LAYERS),
});
export type ImageManifest = z.infer<typeof manifestSchema>;

export const indexSchema = z.object({
  schemaVersion: z.literal(2),
  mediaType: z.string().max(256).optional(),
  manifests: z
    .array(
      descriptor.extend({
        platform: z
          .object({
            architecture: z.string().max(64),
            os: z.string().max(64),
            variant: z.string().max(64).optional(),
          })
          .optional(),
      }),
    )
    .max(4096),
});
export type ImageIndex = z.infer<typeof indexSchema>;

export type Parsed = { kind: "manifest"; manifest: ImageManifest } | { kind: "index"; index: ImageIndex };

/** A manifest or an index, by the media type in the body, else the one the registry sent. */
export function parseManifestOrIndex(bytes: Buffer, contentType: string, what: string): Parsed {
  let j: unknown;
  try {
    j = JSON.parse(bytes.toString("utf8"));
  } catch {
    throw new ForkdError("invalid_argument", `${what}: the manifest is not JSON`);
  }
  const mt =
    (j && typeof j === "object" && typeof (j as { mediaType?: unknown }).mediaType === "string"
      ? (j as { mediaType: string }).mediaType
      : "") || contentType;
  const isIndex =
    mt === MEDIA.ociIndex ||
    mt === MEDIA.dockerList ||
    (mt !== MEDIA.ociManifest &&
      mt !== MEDIA.dockerManifest &&
      j !== null &&
      typeof j === "object" &&
      "manifests" in j);
  if (isIndex) {
    const r = indexSchema.safeParse(j);
    if (!r.success)
      throw new ForkdError(
        "invalid_argument",
        `${what}: not a valid image index: ${z.prettifyError(r.error).slice(0, 300)}`,
      );
    return { kind: "index", index: r.data };
  }
  // OCI makes mediaType optional: a body with a config and layers and no type is an OCI manifest
  // (read back from the cache there is no Content-Type either).
  const untyped = mt === "" && j !== null && typeof j === "object" && "config" in j && "layers" in j;
  if (mt !== MEDIA.ociManifest && mt !== MEDIA.dockerManifest && !untyped) {
    throw new ForkdError(
      "invalid_argument",
      `${what}: manifest media type ${JSON.stringify(mt.slice(0, 200))} is not an image manifest (OCI or Docker schema 2)`,
    );
  }
  const r = manifestSchema.safeParse(j);
  if (!r.success)
    throw new ForkdError(
      "invalid_argument",
      `${what}: not a valid image manifest: ${z.prettifyError(r.error).slice(0, 300)}`,
    );
  return { kind: "manifest", manifest: r.data };
}

/** The linux/amd64 manifest of an index (attestation entries, `unknown/unknown`, are not it). */
export function selectPlatform(index: ImageIndex, what: string): { digest: string; size: number } {
  const m = index.manifests.find(
    (d) =>
      d.platform?.os === "linux" &&
      d.platform.architecture === "amd64" &&
      (d.mediaType === MEDIA.ociManifest || d.mediaType === MEDIA.dockerManifest),
  );
  if (!m) {
    const have = index.manifests
      .map((d) => (d.platform ? `${d.platform.os}/${d.platform.architecture}` : "?"))
      .slice(0, 10)
      .join(", ");
    throw new ForkdError(
      "invalid_argument",
      `${what}: the image has no linux/amd64 manifest (has: ${have || "none"})`,
    );
  }
  return { digest: m.digest, size: m.size };
}
