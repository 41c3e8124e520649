/**
 * The image cache's directories are 0700 (no VM; a real registry on loopback): after a pull,
 * oci/ and everything above the trees (blobs/, layers/, rootfs/, tmp/, their sha256/, the
 * image's rootfs/sha256/<hex>/) is 0700, also when an earlier forkd had made them 0755, while
 * the tree keeps the image's own root mode and setuid bits (inside the 0700 parent). The
 * Dockerfile step cache's directories are 0700 the same way.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { chmod, lstat, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StepCache } from "../../src/image/dockerfile/step-cache.js";
import { ImagePuller } from "../../src/oci/puller.js";
import { makeTar, pushImage } from "../helpers/oci-images.js";
import { startRegistry } from "../helpers/registry.js";
import type { TestRegistry } from "../helpers/registry.js";

let work: string;
let host = "";
let reg: TestRegistry | undefined;

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-oci-modes-"));
  await mkdir(join(work, "registry"));
  reg = await startRegistry(join(work, "registry"));
  host = reg.host;
});
after(async () => {
  await reg?.stop();
  await rm(work, { recursive: true, force: true });
});

const mode = async (p: string) => (await lstat(p)).mode & 0o7777;

test("image cache: oci/ and every directory above the trees are 0700, also a 0755 one from before", async () => {
  const tar = makeTar([
    { name: "./", type: "dir", mode: 0o777 },
    { name: "bin/", type: "dir", mode: 0o755 },
    { name: "bin/su", data: "#!/bin/sh\n", mode: 0o4755 },
    { name: "tmp/", type: "dir", mode: 0o1777 },
  ]);
  const img = await pushImage(host, "modes/a", "v1", [{ tar }]);
  const cacheDir = join(work, "cache");
  // A cache an earlier forkd made: 0755 directories, an image's directory among them.
  const oci = join(cacheDir, "oci");
  const old = join(oci, "rootfs", "sha256", "0".repeat(64));
  for (const d of ["blobs/sha256", "layers/sha256", "tmp"]) await mkdir(join(oci, d), { recursive: true });
  await mkdir(join(old, "tree"), { recursive: true });
  await writeFile(join(old, "image.json"), "{}");
  for (const d of [oci, join(oci, "blobs"), join(oci, "rootfs"), join(oci, "rootfs/sha256"), old]) {
    await chmod(d, 0o755);
  }
  const puller = new ImagePuller({
    cacheDir,
    settings: {
      credentials: () => Promise.resolve(null),
      insecureHosts: [],
      chunkBytes: 64 << 20,
      idleMs: 30_000,
    },
  });
  const pulled = await puller.ensure(img.ref);
  const hex = pulled.digest.replace(/^sha256:/, "");
  for (const d of [
    "",
    "blobs",
    "blobs/sha256",
    "layers",
    "layers/sha256",
    "rootfs",
    "rootfs/sha256",
    `rootfs/sha256/${hex}`,
    `rootfs/sha256/${"0".repeat(64)}`,
    "tmp",
  ]) {
    assert.equal((await mode(join(oci, d))).toString(8), "700", `mode of oci/${d}`);
  }
  // The image's own modes stay, inside the 0700 directory.
  assert.equal(pulled.rootfs, join(oci, "rootfs", "sha256", hex, "tree"));
  assert.equal((await mode(pulled.rootfs)).toString(8), "777");
  assert.equal((await mode(join(pulled.rootfs, "tmp"))).toString(8), "1777");
  if (process.getuid?.() === 0) assert.equal((await mode(join(pulled.rootfs, "bin/su"))).toString(8), "4755");
  // The cache root itself is left as it was (build.sh and the other caches share it).
  assert.equal((await mode(cacheDir)).toString(8), "755");
});

test("step cache: dockerfile/ and its directories are 0700, also a 0755 one from before", async () => {
  const cacheDir = join(work, "steps");
  const root = join(cacheDir, "dockerfile");
  for (const d of ["layers", "images", "results", "tmp"]) await mkdir(join(root, d), { recursive: true });
  for (const d of ["", "layers", "images", "results", "tmp"]) await chmod(join(root, d), 0o755);
  const c = new StepCache(cacheDir);
  const w = await c.workDir();
  await writeFile(join(w, "l"), "layer");
  await c.commit("a".repeat(64), join(w, "l"), { line: 1 });
  await c.setResult("a".repeat(64), "b".repeat(64));
  for (const d of ["", "layers", "images", "results", "tmp", `layers/${"a".repeat(64)}`]) {
    assert.equal((await mode(join(root, d))).toString(8), "700", `mode of dockerfile/${d}`);
  }
  assert.equal((await mode(w)).toString(8), "700");
});
