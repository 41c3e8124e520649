/**
 * Flatten semantics on in-process layers (no registry, no VM): whiteouts, opaque directories,
 * hard links, symlinks, modes, owners, mtimes, xattrs; device nodes skipped and counted (never
 * made on the host), the rest of their image kept; every hostile layer refused naming its
 * entry, with nothing written outside the root; the byte and entry bounds.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtemp, mkdir, readFile, readlink, lstat, rm, writeFile, readdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ImageCache } from "../../src/oci/cache.js";
import { flattenLayers } from "../../src/oci/flatten.js";
import type { FlattenLimits } from "../../src/oci/flatten.js";
import { ForkdError } from "../../src/util/errors.js";
import { MULTI_LAYER_EXPECT, hostileTars, makeTar, multiLayerTars, sha256 } from "../helpers/oci-images.js";

const BIG: FlattenLimits = { maxBytes: 1 << 30, maxEntries: 100_000 };

/** Every directory flatten() made, removed at the end whatever the tests did. */
const made: string[] = [];
after(async () => {
  for (const d of made) await rm(d, { recursive: true, force: true });
});

async function flatten(
  tars: Buffer[],
  limits = BIG,
  progress?: (line: string) => void,
): Promise<{ dir: string; root: string; sizeBytes: number; devicesSkipped: number }> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-oci-flatten-"));
  made.push(dir);
  const root = join(dir, "root");
  await mkdir(root);
  const layers = [];
  for (const [i, t] of tars.entries()) {
    const p = join(dir, `layer${i}.tar`);
    await writeFile(p, t);
    layers.push({ path: p, digest: sha256(t), size: t.length });
  }
  try {
    const r = await flattenLayers({ root, layers, limits, ...(progress ? { progress } : {}) });
    return { dir, root, sizeBytes: r.sizeBytes, devicesSkipped: r.devicesSkipped };
  } catch (e) {
    (e as { dir?: string }).dir = dir;
    throw e;
  }
}

function getfattr(path: string, name: string): Buffer {
  const out = execFileSync("getfattr", ["-h", "--only-values", "-n", name, "--", path]);
  return out;
}

test("flatten: whiteouts, opaque dirs, hard links, symlinks, modes, owners, mtimes, xattrs, FIFOs", async () => {
  const { dir, root, sizeBytes } = await flatten(multiLayerTars());
  try {
    const x = MULTI_LAYER_EXPECT;
    for (const [p, content] of Object.entries(x.files))
      assert.equal(await readFile(join(root, p), "utf8"), content, p);
    for (const p of x.absent)
      await assert.rejects(lstat(join(root, p)), { code: /^(ENOENT|ENOTDIR)$/ }, `${p} must be gone`);
    for (const group of x.hardlinks) {
      const inos = await Promise.all(group.map(async (p) => (await lstat(join(root, p))).ino));
      assert.equal(new Set(inos).size, 1, `${group.join(", ")} are one inode`);
      assert.equal((await lstat(join(root, group[0] ?? ""))).nlink, group.length);
    }
    for (const [p, target] of Object.entries(x.symlinks)) assert.equal(await readlink(join(root, p)), target);
    for (const [p, mode] of Object.entries(x.modes))
      assert.equal((await lstat(join(root, p))).mode & 0o7777, mode, `mode of ${p}`);
    if (process.getuid?.() === 0) {
      for (const [p, [uid, gid]] of Object.entries(x.owners)) {
        const st = await lstat(join(root, p));
        assert.deepEqual([st.uid, st.gid], [uid, gid], `owner of ${p}`);
      }
    }
    for (const [p, mtime] of Object.entries(x.mtimes))
      assert.equal(Math.floor((await lstat(join(root, p))).mtimeMs / 1000), mtime, `mtime of ${p}`);
    for (const [p, [name, value]] of Object.entries(x.xattrs))
      assert.deepEqual(getfattr(join(root, p), name), value, `${name} of ${p}`);
    for (const p of x.fifos) assert.ok((await lstat(join(root, p))).isFIFO(), `${p} is a FIFO`);
    assert.equal(await readFile(join(root, x.longName), "utf8"), "long\n");
    // Directory mtimes are the layers' (set once every layer is in, children added or not).
    assert.equal(Math.floor((await lstat(join(root, "opt/old"))).mtimeMs / 1000), 1_700_000_000);
    // A hard-linked file counts once.
    assert.ok(sizeBytes > 0 && sizeBytes < 10_000, String(sizeBytes));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("flatten: a later layer replaces a symlink by a file, never writing through it", async () => {
  const outside = await mkdtemp(join(tmpdir(), "forkd-oci-outside-"));
  try {
    const { dir, root } = await flatten([
      makeTar([{ name: "link", type: "symlink", linkname: join(outside, "victim") }]),
      makeTar([{ name: "link", data: "replaced\n" }]),
    ]);
    assert.equal(await readFile(join(root, "link"), "utf8"), "replaced\n");
    assert.deepEqual(await readdir(outside), [], "nothing was written outside");
    await rm(dir, { recursive: true, force: true });
  } finally {
    await rm(outside, { recursive: true, force: true });
  }
});

test("flatten: an opaque marker keeps what its own layer wrote under a parent that had no entry", async () => {
  const { dir, root } = await flatten([
    makeTar([
      { name: "a/", type: "dir" },
      { name: "a/old", data: "lower\n" },
      { name: "a/b/", type: "dir" },
      { name: "a/b/old", data: "lower\n" },
    ]),
    // a/b/new, no a/b entry (a/b is made as its parent), and a/ opaque after it.
    makeTar([
      { name: "a/b/new", data: "upper\n" },
      { name: "a/c/d/deep", data: "upper\n" },
      { name: "a/.wh..wh..opq", data: "" },
    ]),
  ]);
  assert.equal(await readFile(join(root, "a/b/new"), "utf8"), "upper\n");
  assert.equal(await readFile(join(root, "a/c/d/deep"), "utf8"), "upper\n");
  // What the lower layer had under a/ is hidden, also inside the kept a/b.
  for (const p of ["a/old", "a/b/old"])
    await assert.rejects(lstat(join(root, p)), { code: "ENOENT" }, `${p} must be gone`);
  assert.deepEqual((await readdir(join(root, "a"))).sort(), ["b", "c"]);
  await rm(dir, { recursive: true, force: true });
});

test("flatten: device nodes (a debootstrap tree's /dev) are skipped and counted; the rest of the image is kept", async () => {
  const char = (name: string, minor: number) =>
    ({ name, type: "char", devmajor: 1, devminor: minor, mode: 0o666 }) as const;
  const lines: string[] = [];
  const { root, devicesSkipped } = await flatten(
    [
      makeTar([
        { name: "./", type: "dir", mode: 0o755 },
        { name: "./dev/", type: "dir", mode: 0o755 },
        char("./dev/null", 3),
        char("./dev/zero", 5),
        char("./dev/full", 7),
        { name: "./dev/sda", type: "block", devmajor: 8, devminor: 0, mode: 0o660 },
        { name: "./dev/null-again", type: "hardlink", linkname: "./dev/null" },
        { name: "./dev/fd", type: "symlink", linkname: "/proc/self/fd" },
        { name: "./dev/initctl", type: "fifo", mode: 0o600 },
        { name: "./etc/", type: "dir", mode: 0o755 },
        { name: "./etc/hostname", data: "deb\n" },
        { name: "./etc/was-a-file", data: "lower\n" },
        { name: "./srv/", type: "dir", mode: 0o755 },
        { name: "./srv/was-a-dir/", type: "dir", mode: 0o755 },
        { name: "./srv/was-a-dir/f", data: "lower\n" },
      ]),
      // A node replaces what a lower layer had there, file or directory, as any entry does.
      makeTar([char("etc/was-a-file", 3), char("srv/was-a-dir", 3)]),
    ],
    BIG,
    (line) => lines.push(line),
  );
  assert.equal(devicesSkipped, 7);
  assert.ok(
    lines.includes("skipped 7 device nodes (never made on the host; the guest's /dev is its own devtmpfs)"),
    lines.join("\n"),
  );
  assert.deepEqual((await readdir(join(root, "dev"))).sort(), ["fd", "initctl"]);
  assert.equal(await readlink(join(root, "dev/fd")), "/proc/self/fd");
  assert.ok((await lstat(join(root, "dev/initctl"))).isFIFO(), "a FIFO is kept");
  assert.equal(await readFile(join(root, "etc/hostname"), "utf8"), "deb\n");
  for (const p of ["etc/was-a-file", "srv/was-a-dir"])
    await assert.rejects(lstat(join(root, p)), { code: "ENOENT" }, `${p} must be gone`);
  // Nothing anywhere in the tree is a device.
  const out = execFileSync("find", [root, "(", "-type", "c", "-o", "-type", "b", ")", "-print"], {
    encoding: "utf8",
  });
  assert.equal(out, "");
});

test("flatten: every hostile layer is refused, naming its entry, and nothing lands outside the root", async () => {
  const outside = "/tmp/forkd-oci-hostile-" + process.pid;
  for (const [name, h] of Object.entries(hostileTars())) {
    let dir: string | undefined;
    await assert.rejects(
      async () => {
        dir = (await flatten(h.layers)).dir;
      },
      (e: unknown) => {
        dir = (e as { dir?: string }).dir;
        assert.ok(e instanceof ForkdError, `${name}: ${String(e)}`);
        assert.equal(e.code, "invalid_argument", name);
        assert.ok(
          e.message.includes(`entry ${JSON.stringify(h.entry)}`),
          `${name}: the message names ${h.entry}: ${e.message}`,
        );
        assert.match(e.message, h.why, name);
        return true;
      },
      name,
    );
    if (dir) {
      // Nothing next to the root or above it.
      assert.deepEqual((await readdir(dir)).filter((n) => !n.endsWith(".tar")).sort(), ["root"], name);
      await assert.rejects(lstat(join(dir, "escape.txt")), { code: "ENOENT" });
      await rm(dir, { recursive: true, force: true });
    }
  }
  await assert.rejects(lstat("/tmp/pwned"), { code: "ENOENT" });
  await assert.rejects(lstat(outside), { code: "ENOENT" });
});

test("flatten: the byte and entry bounds are enforced before anything past them is written", async () => {
  const tar = makeTar([
    { name: "a", data: Buffer.alloc(3000, 1) },
    { name: "b", data: Buffer.alloc(3000, 2) },
  ]);
  await assert.rejects(flatten([tar], { maxBytes: 5000, maxEntries: 100 }), (e: unknown) => {
    assert.ok(e instanceof ForkdError && e.code === "payload_too_large", String(e));
    assert.match(e.message, /entry "b".*more than 5000 bytes/);
    return true;
  });
  const many = makeTar(Array.from({ length: 20 }, (_, i) => ({ name: `f${i}`, data: "x" })));
  await assert.rejects(
    flatten([many], { maxBytes: 1 << 20, maxEntries: 10 }),
    (e: unknown) =>
      e instanceof ForkdError && e.code === "payload_too_large" && /more than 10 entries/.test(e.message),
  );
  const ok = await flatten([many], { maxBytes: 1 << 20, maxEntries: 20 });
  await rm(ok.dir, { recursive: true, force: true });
});

test("image cache: a puller's start removes the temporaries of processes that no longer run, not of live ones", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-oci-cache-"));
  try {
    const cache = new ImageCache(dir);
    await cache.init();
    const dead = join(cache.tmpDir, "999999999-abc-rootfs");
    const live = cache.tmp("layer");
    const junk = join(cache.tmpDir, "not-ours");
    for (const p of [dead, live, junk]) await mkdir(p);
    await writeFile(join(dead, "half.tar"), "x");
    await cache.sweep();
    assert.deepEqual((await readdir(cache.tmpDir)).sort(), [live.split("/").pop()]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
