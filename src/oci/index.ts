/**
 * What oci offers: OCI image pulls, flattened into cached root trees under bounds. Other folders
 * import this folder through this file alone (test/unit/layering.test.ts).
 */
export type { ImageConfig } from "./image.js";
export { imageLimitsFromEnv } from "./limits.js";
export { ImagePuller } from "./puller.js";
