/**
 * What the image builder needs of a pulled image (src/oci/puller.ts's PulledImage has this
 * shape and more): a flattened root tree, the digest that names it, and the parts of its
 * config a guest honours. Declared here so the builder does not depend on the OCI client.
 */
import type { Reach } from "../registry/index.js";
import type { Progress } from "../util/index.js";

export interface RootfsImageConfig {
  /** "KEY=VALUE" entries. */
  env: string[];
  workingDir: string | null;
  user: string | null;
}

export interface RootfsImage {
  /** The normalized reference it was pulled by. */
  ref: string;
  /** "sha256:<hex>" of its (platform) manifest: the same digest always means the same tree. */
  digest: string;
  /** A directory holding the flattened tree: read only, never modified. */
  rootfs: string;
  config: RootfsImageConfig;
}

/**
 * Resolves an image reference to a pulled image (src/oci/puller.ts's ImagePuller). `reach`: whose
 * pull it is (a tenant's reaches only what src/registry/reach.ts admits; default the operator's).
 */
export interface ImageResolver {
  ensure(ref: string, progress?: Progress, signal?: AbortSignal, reach?: Reach): Promise<RootfsImage>;
  /** Refuses at once a reference `reach` may not pull from (absent: nothing to check). */
  admit?(ref: string, reach: Reach): Promise<void>;
}
