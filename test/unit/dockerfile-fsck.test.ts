/**
 * The check of a freshly built root filesystem (no VM; mke2fs and debugfs make the disks): a
 * clean ext4 passes, and so does one whose only fault is what a mounted ext4 leaves (stale
 * superblock free totals); one e2fsck had to repair (blocks in use marked free, a wrong link
 * count) fails the build with e2fsck's findings, where exit 1 used to be accepted. e2fsck runs
 * as the daemon runs it (jailed when root), and the image is the daemon's again after.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { copyFile, mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { checkBuiltFilesystem, unexpectedFixes } from "../../src/image/dockerfile/fsck.js";
import { testTools } from "../helpers/tools.js";

const { tools, release } = await testTools();
after(release);

const PATH = `${process.env.PATH ?? ""}:/sbin:/usr/sbin`;
const sh = (cmd: string, args: string[]) =>
  execFileSync(cmd, args, { env: { ...process.env, PATH }, stdio: ["ignore", "pipe", "pipe"] }).toString();

test("a built root filesystem e2fsck had to repair fails the build", async () => {
  const dir = await mkdtemp(join(tmpdir(), "forkd-fsck-"));
  try {
    const img = (n: string) => join(dir, n);
    sh("mke2fs", ["-q", "-t", "ext4", "-F", img("clean"), "16M"]);
    await writeFile(img("payload"), Buffer.alloc(1 << 20, 7));
    sh("debugfs", ["-w", "-R", `write ${img("payload")} f`, img("clean")]);
    const extents = sh("debugfs", ["-R", "stat f", img("clean")]);
    const first = /\(0-\d+\):(\d+)-/.exec(extents)?.[1];
    assert.ok(first, extents);
    for (const n of ["stale", "freed", "links"]) await copyFile(img("clean"), img(n));
    sh("debugfs", ["-w", "-R", "ssv free_blocks_count 123", img("stale")]);
    sh("debugfs", ["-w", "-R", `freeb ${first} 50`, img("freed")]);
    sh("debugfs", ["-w", "-R", "sif f links_count 5", img("links")]);

    await checkBuiltFilesystem(tools, img("clean"));
    await checkBuiltFilesystem(tools, img("stale")); // e2fsck exits 1, the fix is the expected one
    const st = await stat(img("stale"));
    assert.deepEqual([st.uid, st.mode & 0o7777], [process.getuid?.() ?? 0, 0o644], "taken back");
    for (const [n, re] of [
      ["freed", /Block bitmap differences/],
      ["links", /ref count is 5, should be 1/],
    ] as const) {
      await assert.rejects(
        checkBuiltFilesystem(tools, img(n)),
        (e: Error & { code?: string; details?: { fsck_exit?: number } }) => {
          assert.equal(e.code, "image_error", e.message);
          assert.equal(e.details?.fsck_exit, 1);
          assert.match(e.message, re);
          return true;
        },
      );
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("unexpectedFixes: only the superblock totals are expected", () => {
  const out = [
    "Pass 5: Checking group summary information",
    "Free blocks count wrong (123, counted=12011).",
    "Fix? yes",
    "",
    "Free inodes count wrong for group #0 (10, counted=9).",
    "Fix? yes",
    "Inode 12 ref count is 5, should be 1.  Fix? yes",
  ].join("\n");
  assert.deepEqual(unexpectedFixes(out), [
    "Free inodes count wrong for group #0 (10, counted=9).",
    "Inode 12 ref count is 5, should be 1.",
  ]);
});
