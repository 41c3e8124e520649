/**
 * Committing one build's frozen step layers into the step cache, in order. Each layer is a qcow2
 * delta over the layer before it in this build's own chain; before it is committed it is rebased
 * onto the cached path of its parent (which this build committed just before it).
 *
 * The rule for concurrent builds sharing a step prefix: once a commit finds its key already taken
 * (another build committed the same step first), no later layer of this chain is committed. Those
 * layers are deltas over this build's own layer for that step, not over the cached one (the two
 * are equal steps but not equal bytes: ext4 allocates differently), so rebasing them onto the
 * cached layer would make a corrupt disk. This build's own image still comes from its own chain:
 * the uncommitted layers stay in the build's working directory, still backed by each other, and
 * the top of that chain is what the caller installs.
 */

export interface ChainLayer {
  key: string;
  /** The layer file in the build's working directory. */
  file: string;
  info: Record<string, unknown>;
}

/** The part of the step cache committing needs (step-cache.ts StepCache). */
export interface ChainCache {
  /** Moves `file` into the cache as `key`; false when `key` was already there (file left as is). */
  commit(key: string, file: string, info: Record<string, unknown>): Promise<boolean>;
  layer(key: string): string;
}

/**
 * Commits `layers` (in chain order; the first already backed by `parentPath`) and returns the
 * path of the top of this build's chain: the cached layer of the last key while every commit was
 * this build's own, else the last layer's own file (or `parentPath` when there is no layer).
 */
export async function commitChain(
  cache: ChainCache,
  layers: readonly ChainLayer[],
  parentPath: string,
  rebase: (file: string, backing: string) => Promise<void>,
): Promise<string> {
  let backing = parentPath;
  for (const [j, l] of layers.entries()) {
    if (j > 0) await rebase(l.file, backing);
    if (!(await cache.commit(l.key, l.file, l.info))) return layers[layers.length - 1]?.file ?? parentPath;
    backing = cache.layer(l.key);
  }
  return backing;
}
