/**
 * readFileTail (src/util/file-tail.ts) reads files a jailed VMM may have replaced: a symbolic
 * link is not followed, and a FIFO is refused at once instead of hanging the read.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readFileTail } from "../../src/util/file-tail.js";

test(
  "a file's tail; a symbolic link, a FIFO and a missing file are no file",
  { timeout: 10_000 },
  async () => {
    const dir = await mkdtemp(join(tmpdir(), "forkd-tail-"));
    try {
      const file = join(dir, "console.log");
      await writeFile(file, "0123456789");
      const t = await readFileTail(file, 4);
      assert.equal(t?.bytes.toString(), "6789");
      assert.equal(t?.size, 10);
      const secret = join(dir, "secret");
      await writeFile(secret, "host secret");
      const link = join(dir, "link.log");
      await symlink(secret, link);
      assert.equal(await readFileTail(link, 100), null, "a link is not followed");
      const fifo = join(dir, "fifo.log");
      execFileSync("mkfifo", [fifo]);
      assert.equal(await readFileTail(fifo, 100), null, "a FIFO is refused without blocking");
      assert.equal(await readFileTail(join(dir, "none"), 100), null);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },
);
