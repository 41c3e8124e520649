/**
 * What a pull hands its caller: the image's config (the parts forkd honours) and where its
 * flattened root filesystem is. The shapes are fixed by the issue 13 interfaces (section 5).
 */
export interface ImageConfig {
  /** "K=V" */
  env: string[];
  workingDir: string | null;
  user: string | null;
  entrypoint: string[] | null;
  cmd: string[] | null;
  labels: Record<string, string>;
}

export interface PulledImage {
  /** Normalized, e.g. "docker.io/library/python:3.11" or "127.0.0.1:5000/x:y". */
  ref: string;
  /** "sha256:<hex>" of the (platform) manifest. */
  digest: string;
  /** A directory holding the flattened tree: read-only, never modify it. */
  rootfs: string;
  config: ImageConfig;
  /** Of the flattened tree (regular files' apparent sizes). */
  sizeBytes: number;
}
