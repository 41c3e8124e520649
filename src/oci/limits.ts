/**
 * The bounds of a pull, read once from the daemon's environment by its entry point:
 *
 *   FORKD_IMAGE_MAX_MIB       a layer's uncompressed tar, and the flattened tree's files, are at
 *                             most this large (16384 = 16 GiB)
 *   FORKD_IMAGE_MAX_ENTRIES   entries over all of an image's layers (1,000,000)
 */
import { ForkdError } from "../util/index.js";
import type { FlattenLimits } from "./flatten.js";

export const DEFAULT_LIMITS: FlattenLimits = { maxBytes: 16 * 2 ** 30, maxEntries: 1_000_000 };

function positiveInt(env: NodeJS.ProcessEnv, key: string, dflt: number): number {
  const v = env[key];
  if (v === undefined || v === "") return dflt;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1) {
    throw new ForkdError("invalid_argument", `${key} must be an integer >= 1, not ${JSON.stringify(v)}`);
  }
  return n;
}

export function imageLimitsFromEnv(env: NodeJS.ProcessEnv): FlattenLimits {
  return {
    maxBytes: positiveInt(env, "FORKD_IMAGE_MAX_MIB", DEFAULT_LIMITS.maxBytes / 2 ** 20) * 2 ** 20,
    maxEntries: positiveInt(env, "FORKD_IMAGE_MAX_ENTRIES", DEFAULT_LIMITS.maxEntries),
  };
}
