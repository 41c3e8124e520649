/**
 * A snapshot from an image with no Python: a static busybox tree (the host's busybox-static and
 * its applets as symlinks, nothing else), served by the test-only resolver (FORKD_TEST_IMAGES).
 * It forks and execs; eval there is a clear `unavailable` naming the missing interpreter.
 * The agent reports ready at once when the image has no interpreter (no kernel to wait for).
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, symlink, copyFile, writeFile } from "node:fs/promises";
import { execFile } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { api, forkOne, sh } from "../helpers/vm.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { ApiError } from "../helpers/http.js";

const REF = "localhost/forkd-test/busybox:1";
let d: TestDaemon;
let work: string;

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-imgbb-"));
  const tree = join(work, "rootfs");
  await mkdir(join(tree, "bin"), { recursive: true });
  await copyFile("/bin/busybox", join(tree, "bin/busybox"));
  const { stdout } = await promisify(execFile)("/bin/busybox", ["--list"]);
  for (const a of stdout.split("\n").filter((x) => x && x !== "busybox"))
    await symlink("busybox", join(tree, "bin", a));
  const digest = `sha256:${createHash("sha256")
    .update(await readFile("/bin/busybox"))
    .update("forkd-test busybox tree 1")
    .digest("hex")}`;
  const images = join(work, "images.json");
  await writeFile(
    images,
    JSON.stringify({
      [REF]: {
        digest,
        rootfs: tree,
        config: { env: ["PATH=/bin", "FLAVOUR=busybox"], workingDir: "/", user: null },
      },
    }),
  );
  d = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_TEST_IMAGES: images });
});

after(async () => {
  await d?.destroy(false);
  await rm(work, { recursive: true, force: true });
});

let made = false;

test("a snapshot from an image without Python is made (no kernel to wait for)", async () => {
  await api(d, "POST", "/v1/snapshots", { tag: "bb", image: REF, memory_mib: 128 });
  made = true;
});

test("its child execs with busybox, and has none of the host's Debian", async () => {
  assert.ok(made, "no snapshot");
  const id = await forkOne(d, "bb");
  assert.equal(await sh(d, id, "echo hi; [ -e /usr/bin/python3 ] && echo python || echo none"), "hi\nnone\n");
});

test("eval there is unavailable, naming the missing interpreter", async () => {
  assert.ok(made, "no snapshot");
  const id = await forkOne(d, "bb");
  await assert.rejects(
    api(d, "POST", `/v1/sandboxes/${id}/eval`, { code: "1 + 1" }),
    (e: unknown) =>
      e instanceof ApiError && e.status === 503 && e.code === "unavailable" && /python3/.test(e.message),
  );
});
