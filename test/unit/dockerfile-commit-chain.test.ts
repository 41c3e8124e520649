/**
 * Committing a build's step layers (no VM): with a fake cache, a build whose step a concurrent
 * build committed first commits none of its later layers (they are deltas over its own layer,
 * not the cached one) and installs its own chain; the real StepCache says when a key was taken
 * and leaves the layer file where it was.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { commitChain } from "../../src/image/dockerfile/commit-chain.js";
import type { ChainCache } from "../../src/image/dockerfile/commit-chain.js";
import { StepCache } from "../../src/image/dockerfile/step-cache.js";

/** A cache holding `taken` keys already (another build's), recording what is done to it. */
function fakeCache(taken: string[]) {
  const held = new Map<string, string>(taken.map((k) => [k, `other:${k}`]));
  const log: string[] = [];
  const cache: ChainCache = {
    commit(key, file) {
      if (held.has(key)) {
        log.push(`taken ${key}`);
        return Promise.resolve(false);
      }
      held.set(key, file);
      log.push(`commit ${key} ${file}`);
      return Promise.resolve(true);
    },
    layer: (key) => `/cache/${key}`,
  };
  const rebase = (file: string, backing: string) => {
    log.push(`rebase ${file} onto ${backing}`);
    return Promise.resolve();
  };
  return { cache, rebase, log, held };
}

const layers = ["k0", "k1", "k2", "k3"].map((key, i) => ({ key, file: `/work/step-${i}`, info: {} }));

test("commitChain: no concurrent build: every layer committed over the cached one before it", async () => {
  const f = fakeCache([]);
  const top = await commitChain(f.cache, layers, "/base.raw", f.rebase);
  assert.equal(top, "/cache/k3");
  assert.deepEqual(f.log, [
    "commit k0 /work/step-0",
    "rebase /work/step-1 onto /cache/k0",
    "commit k1 /work/step-1",
    "rebase /work/step-2 onto /cache/k1",
    "commit k2 /work/step-2",
    "rebase /work/step-3 onto /cache/k2",
    "commit k3 /work/step-3",
  ]);
});

test("commitChain: a step another build committed first ends this build's commits", async () => {
  const f = fakeCache(["k1"]);
  const top = await commitChain(f.cache, layers, "/base.raw", f.rebase);
  // Step 2 is a delta over this build's step-1 layer: never rebased onto the other build's k1
  // nor committed; this build's image is its own chain's top.
  assert.equal(top, "/work/step-3");
  assert.deepEqual(f.log, ["commit k0 /work/step-0", "rebase /work/step-1 onto /cache/k0", "taken k1"]);
  assert.equal(f.held.has("k2"), false);
  assert.equal(f.held.has("k3"), false);
  // Taken at the first layer: nothing rebased at all.
  const g = fakeCache(["k0"]);
  assert.equal(await commitChain(g.cache, layers, "/base.raw", g.rebase), "/work/step-3");
  assert.deepEqual(g.log, ["taken k0"]);
  assert.equal(await commitChain(g.cache, [], "/base.raw", g.rebase), "/base.raw");
});

test("StepCache.commit: false when the key is taken, the layer file left in place", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-chain-"));
  try {
    const c = new StepCache(dir);
    const key = "d".repeat(64);
    const work = await c.workDir();
    await writeFile(join(work, "a"), "A");
    await writeFile(join(work, "b"), "B");
    assert.equal(await c.commit(key, join(work, "a"), {}), true);
    assert.equal(await c.commit(key, join(work, "b"), {}), false);
    assert.equal(await readFile(join(work, "b"), "utf8"), "B");
    assert.equal(await readFile(c.layer(key), "utf8"), "A");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
