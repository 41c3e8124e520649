/**
 * Installing a finished build's disk chain (src/image/dockerfile/install.ts, the step every
 * Dockerfile build ends with) when the build's layers are hostile: a layer is what the build VM
 * wrote, and a VMM that escaped its guest writes the qcow2 header it likes. A layer naming a host
 * ext4 image as its external data file made root's `qemu-img convert` copy that host file into
 * the tenant's image (and e2fsck passed it); jailed, the tool cannot see it and the build fails
 * with the tool's own error. A layer naming a backing file outside the build is refused before
 * any tool runs. A clean chain installs, its files the daemon's.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import type { GuestImage } from "../../src/image/builder.js";
import { installImage } from "../../src/image/dockerfile/install.js";
import { testTools } from "../helpers/tools.js";

const sh = promisify(execFile);
const PATH = `${process.env.PATH ?? ""}:/sbin:/usr/sbin`;
const run = (cmd: string, args: string[]) => sh(cmd, args, { env: { ...process.env, PATH } });
const { tools, release } = await testTools();
after(release);
const skip = tools.jailed ? false : "needs root and native/jailer (the jail)";

/** A base image (an 8 MiB ext4 rootfs with `marker`) and a build's working directories. */
async function world(marker: string) {
  const root = await mkdtemp(join(tmpdir(), "forkd-install-"));
  const base = join(root, "cache", "images", "base");
  const content = join(root, "content");
  await mkdir(base, { recursive: true });
  await mkdir(content);
  await writeFile(join(content, "marker"), `${marker}\n`);
  await run("mke2fs", ["-q", "-t", "ext4", "-d", content, "-F", join(base, "rootfs.ext4"), "8M"]);
  await writeFile(join(base, "vmlinuz"), "kernel");
  await writeFile(join(base, "initrd.img"), "initrd");
  const image: GuestImage = {
    hash: "h",
    content: "c",
    dir: base,
    template: "t",
    kernel: join(base, "vmlinuz"),
    initrd: join(base, "initrd.img"),
    rootfs: join(base, "rootfs.ext4"),
    kernelVersion: "6",
  };
  const steps = join(root, "cache", "dockerfile");
  const work = join(steps, "tmp", "build-1");
  await mkdir(work, { recursive: true });
  const imagesDir = join(steps, "images");
  const request = (top: string) => ({
    top,
    base: image,
    key: "k".repeat(64),
    work,
    imagesDir,
    extra: {},
    tools,
    within: [steps],
  });
  return { root, image, work, steps, imagesDir, request };
}

/** What `debugfs` reads of /marker in an ext4 image. */
const markerOf = async (img: string) => (await run("debugfs", ["-R", "cat /marker", img])).stdout.trim();

test("a clean build chain installs, jailed, as the daemon's files", { skip }, async () => {
  const w = await world("base");
  try {
    const top = join(w.work, "step-0.qcow2");
    await run("qemu-img", ["create", "-q", "-f", "qcow2", "-b", w.image.rootfs, "-F", "raw", top]);
    const address = await installImage(w.request(top));
    const rootfs = join(w.imagesDir, address, "rootfs.ext4");
    assert.equal(await markerOf(rootfs), "base");
    const st = await stat(rootfs);
    assert.deepEqual([st.uid, st.gid, st.mode & 0o7777], [0, 0, 0o444]);
    const runs = tools
      .runs()
      .filter((r) => r.jailed)
      .map((r) => r.tool);
    assert.ok(runs.includes("qemu-img") && runs.includes("e2fsck"), `jailed runs: ${runs.join(", ")}`);
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});

test(
  "a build layer naming a host file as its data file cannot read it: the jailed tool fails",
  { skip },
  async () => {
    const w = await world("base");
    try {
      // The host's file: an ext4 image a tenant must never see (root's, 0600, outside the build).
      const secret = join(w.root, "host-secret.ext4");
      const top = join(w.work, "step-0.qcow2");
      // qemu-img creates the data file: made first, then the host's file put in its place.
      await run("qemu-img", [
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        `data_file=${secret},data_file_raw=on`,
        top,
        "8M",
      ]);
      const content = join(w.root, "secret-content");
      await mkdir(content);
      await writeFile(join(content, "marker"), "HOST SECRET\n");
      await run("mke2fs", ["-q", "-t", "ext4", "-d", content, "-F", secret, "8M"]);
      await sh("chmod", ["600", secret]);
      const before = await readFile(secret);
      await assert.rejects(installImage(w.request(top)), (e: Error) => {
        assert.match(
          e.message,
          /qemu-img convert .* failed: .*Could not open '.*host-secret\.ext4': No such file or directory/,
        );
        return true;
      });
      // Nothing was installed, and the host's file is as it was, still root's alone.
      assert.deepEqual(await readdir(w.imagesDir).catch(() => []), []);
      assert.ok((await readFile(secret)).equals(before));
      const st = await stat(secret);
      assert.deepEqual([st.uid, st.mode & 0o7777], [0, 0o600]);
    } finally {
      await rm(w.root, { recursive: true, force: true });
    }
  },
);

test("a build layer naming a backing file outside the build is refused before any tool runs", async () => {
  const w = await world("base");
  try {
    const other = join(w.root, "elsewhere.raw");
    await writeFile(other, Buffer.alloc(1 << 20));
    const top = join(w.work, "step-0.qcow2");
    await run("qemu-img", ["create", "-q", "-f", "qcow2", "-b", other, "-F", "raw", top]);
    const ran = tools.runs().reduce((n, r) => n + r.runs, 0);
    await assert.rejects(installImage(w.request(top)), /names a backing file outside its chain/);
    assert.equal(
      tools.runs().reduce((n, r) => n + r.runs, 0),
      ran,
      "no tool ran",
    );
  } finally {
    await rm(w.root, { recursive: true, force: true });
  }
});
