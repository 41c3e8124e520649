/**
 * The Dockerfile step cache (no VM): a layer is found only once committed complete (its
 * directory renamed into place with step.json), a second commit of the same key keeps the
 * first, a result names an installed image only, and a killed build's working directory is
 * removed by the next build while a live one's is kept.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StepCache } from "../../src/image/dockerfile/step-cache.js";
import { exists } from "../../src/util/fs.js";

const KEY = "a".repeat(64);

test("step cache: commit, reuse, results, and a dead build's leftovers", async () => {
  const cacheDir = await mkdtemp(join(tmpdir(), "forkd-stepcache-"));
  try {
    const c = new StepCache(cacheDir);
    assert.equal(await c.has(KEY), false);
    assert.equal(await c.has("../x"), false);
    const work = await c.workDir();
    await writeFile(join(work, "l1"), "layer one");
    await c.commit(KEY, join(work, "l1"), { line: 3 });
    assert.equal(await c.has(KEY), true);
    assert.equal(await readFile(c.layer(KEY), "utf8"), "layer one");
    // An equal step committed again (a concurrent build): the first stays.
    await writeFile(join(work, "l2"), "layer two");
    await c.commit(KEY, join(work, "l2"), { line: 3 });
    assert.equal(await readFile(c.layer(KEY), "utf8"), "layer one");
    // A half-made layer directory (no step.json) is never found.
    await mkdir(join(cacheDir, "dockerfile/layers", "b".repeat(64)), { recursive: true });
    await writeFile(join(cacheDir, "dockerfile/layers", "b".repeat(64), "layer.qcow2"), "partial");
    assert.equal(await c.has("b".repeat(64)), false);
    // A result counts only while its image is installed.
    const address = "c".repeat(64);
    await c.setResult(KEY, address);
    assert.equal(await c.result(KEY), null);
    await mkdir(join(c.imagesDir(), address), { recursive: true });
    await writeFile(join(c.imagesDir(), address, "manifest.json"), "{}");
    assert.equal(await c.result(KEY), address);
    // Leftovers of a process that is gone are swept; this process's own build is kept.
    const child = spawn("true");
    const pid = await new Promise<number>((r) => child.on("exit", () => r(child.pid ?? 0)));
    const dead = join(cacheDir, "dockerfile/tmp", `build-${pid}-deadbeef0000`);
    await mkdir(dead);
    const next = await c.workDir();
    assert.equal(await exists(dead), false);
    assert.equal(await exists(work), true);
    assert.deepEqual(
      (await readdir(join(cacheDir, "dockerfile/tmp"))).sort(),
      [work, next].map((p) => p.split("/").pop()).sort(),
    );
  } finally {
    await rm(cacheDir, { recursive: true, force: true });
  }
});
