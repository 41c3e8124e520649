/**
 * Snapshots from images, with real VMs: a Debian tree (the cached debootstrap tarball, plus a
 * few files of the test's) served as an image by the test-only resolver (FORKD_TEST_IMAGES),
 * with an Env and a WorkingDir. One daemon and one image snapshot for the file: its start_cmd
 * serves HTTP, ready_cmd waits for it, and a forked child finds the server up; the image's own
 * files are unchanged (forkd's are under /.forkd/ only); `source` is served; a second snapshot
 * of the same image builds nothing; the CLI makes one (and `forkd images` shows its source); it
 * packs and unpacks into a daemon with an empty image cache; a start command that fails is a
 * bounded, clear error.
 *
 * The OCI puller (src/oci/) will serve the same trees from a loopback registry; these tests
 * need only a rootfs directory and a digest naming it.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { promisify } from "node:util";
import { api, forkOne, sh } from "../helpers/vm.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { rawRequest, readAll } from "../helpers/http.js";
import { steps } from "../helpers/steps.js";
import { debootstrapTarball } from "../helpers/oci-images.js";

const sh$ = promisify(execFile);
const { step, failed } = steps();
const CACHE = process.env.FORKD_CACHE_DIR ?? "/var/cache/forkd";
const REF = "localhost/forkd-test/debian:1";
const ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hello image"];
const WORKDIR = "/srv/app";
/** What this file adds to the tree; part of the digest, so a changed tree is a new image. */
const ADDED = { "srv/app/index.html": "served from the image\n", "etc/forkd-image-test": "mine\n" };
/** The image's own files the test checks: every regular file under these, by sha256. */
const CHECKED = "etc usr/bin usr/sbin";
const sumFiles = `cd / && find ${CHECKED} -xdev -type f ! -name resolv.conf -print0 | sort -z | xargs -0 sha256sum | sha256sum`;

let d: TestDaemon;
let b: TestDaemon | undefined;
let work: string;
let tree: string;
let digest: string;

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-imgsnap-"));
  // The python template's debootstrap tree (made by build.sh when no cache holds it).
  const tarball = await debootstrapTarball(CACHE);
  const base = basename(dirname(tarball));
  tree = join(work, "rootfs");
  await mkdir(tree);
  await sh$("sh", [
    "-c",
    `zstd -dcq "$1" | tar --numeric-owner --xattrs --xattrs-include='*' -xpf - -C "$2"`,
    "-",
    tarball,
    tree,
  ]);
  for (const [p, text] of Object.entries(ADDED)) {
    await mkdir(join(tree, p, ".."), { recursive: true });
    await writeFile(join(tree, p), text);
  }
  digest = `sha256:${createHash("sha256")
    .update(`${base}\n${JSON.stringify(ADDED)}\n${JSON.stringify(ENV)}`)
    .digest("hex")}`;
  const images = join(work, "images.json");
  await writeFile(
    images,
    JSON.stringify({
      [REF]: { digest, rootfs: tree, config: { env: ENV, workingDir: WORKDIR, user: null } },
    }),
  );
  d = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_TEST_IMAGES: images });
});

after(async () => {
  await d?.destroy(failed());
  await b?.destroy(failed());
  await rm(work, { recursive: true, force: true });
});

/** POST /v1/snapshots?stream=1: the progress messages and the final event. */
async function createStreamed(body: unknown): Promise<{ messages: string[]; last: Record<string, unknown> }> {
  const res = await rawRequest(d.ep, "POST", "/v1/snapshots?stream=1", JSON.stringify(body), 1_800_000, {
    "content-type": "application/json",
  });
  const lines = (await readAll(res)).toString("utf8").trim().split("\n");
  const events = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  return {
    messages: events.filter((e) => e.type === "progress").map((e) => String(e.message)),
    last: events[events.length - 1] ?? {},
  };
}

const START = `python3 -m http.server 8080 --bind 127.0.0.1`;
const READY = `python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/index.html', timeout=2)"`;
let firstImageDir = "";

step("a snapshot from the image runs start_cmd until ready_cmd succeeds", async () => {
  const r = await createStreamed({
    tag: "img",
    image: REF,
    memory_mib: 384,
    start_cmd: `env > /tmp/start-env; pwd > /tmp/start-cwd; exec ${START}`,
    ready_cmd: READY,
  });
  assert.equal(r.last.type, "done", JSON.stringify(r.last));
  const snap = r.last.snapshot as { source: unknown; template: string; image: { dir: string } };
  assert.deepEqual(snap.source, { kind: "image", ref: REF, digest });
  assert.equal(snap.template, "image");
  assert.ok(
    r.messages.some((m) => m.startsWith("start: ")),
    r.messages.join("\n"),
  );
  assert.ok(
    r.messages.some((m) => /^ready: .* succeeded/.test(m)),
    r.messages.join("\n"),
  );
  firstImageDir = snap.image.dir;
});

step("the server start_cmd started answers in a forked child", async () => {
  const id = await forkOne(d, "img");
  const body = await sh(
    d,
    id,
    `python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/index.html', timeout=10).read().decode(), end='')"`,
  );
  assert.equal(body, ADDED["srv/app/index.html"]);
  // start_cmd ran with the image's Env and WorkingDir.
  assert.match(await sh(d, id, "cat /tmp/start-env"), /^GREETING=hello image$/m);
  assert.equal((await sh(d, id, "cat /tmp/start-cwd")).trim(), WORKDIR);
  await api(d, "DELETE", `/v1/sandboxes/${id}`);
});

step("the image's files are as they were; forkd's own are under /.forkd/ only", async () => {
  const id = await forkOne(d, "img");
  const { stdout: host } = await sh$("sh", ["-c", sumFiles.replace("cd /", `cd "${tree}"`)]);
  assert.equal(await sh(d, id, sumFiles), host);
  assert.equal(await sh(d, id, "cat /etc/forkd-image-test"), ADDED["etc/forkd-image-test"]);
  const present = await sh(
    d,
    id,
    "for f in /sbin/forkd-agent /usr/lib/forkd /.forkd/forkd-agent /.forkd/forkd_eval.py; do [ -e $f ] && echo $f; done; true",
  );
  assert.deepEqual(present.trim().split("\n"), ["/.forkd/forkd-agent", "/.forkd/forkd_eval.py"]);
  // The image config, in the formats the agent reads (docs/images.md).
  assert.equal(await sh(d, id, "tr '\\0' '\\n' < /.forkd/env"), ENV.map((e) => `${e}\n`).join(""));
  assert.equal(await sh(d, id, "cat /.forkd/config"), `cwd=${WORKDIR}\n`);
  await api(d, "DELETE", `/v1/sandboxes/${id}`);
});

test("exec in a child sees the image's Env, and its cwd is the WorkingDir", async () => {
  const id = await forkOne(d, "img");
  try {
    assert.equal((await sh(d, id, 'echo "$GREETING"; pwd')).trim(), `hello image\n${WORKDIR}`);
  } finally {
    await api(d, "DELETE", `/v1/sandboxes/${id}`);
  }
});

step("GET /v1/snapshots shows where the snapshot came from", async () => {
  const r = await api<{ snapshots: { tag: string; source: unknown }[] }>(d, "GET", "/v1/snapshots");
  assert.deepEqual(r.snapshots.find((s) => s.tag === "img")?.source, { kind: "image", ref: REF, digest });
});

step("a second snapshot of the same image builds nothing", async () => {
  const r = await createStreamed({ tag: "img2", image: REF, memory_mib: 256 });
  assert.equal(r.last.type, "done", JSON.stringify(r.last));
  const snap = r.last.snapshot as { image: { dir: string } };
  assert.equal(snap.image.dir, firstImageDir);
  // (The agent step always runs: it checks the agent build is current.)
  const done = r.messages.filter((m) => m.startsWith("DONE ") && !m.startsWith("DONE agent "));
  assert.ok(
    done.some((m) => m.startsWith("DONE final-image ")),
    r.messages.join("\n"),
  );
  assert.deepEqual(
    done.filter((m) => !m.endsWith(" cached")),
    [],
    `every build step cached: ${done.join(" | ")}`,
  );
});

step("a start command that fails ends the creation at once with its output", async () => {
  const r = await createStreamed({
    tag: "img-bad",
    image: REF,
    memory_mib: 256,
    start_cmd: "echo cannot-start-here >&2; exit 3",
    ready_cmd: "false",
    ready_timeout_ms: 600_000,
  });
  assert.equal(r.last.type, "error", JSON.stringify(r.last));
  const err = r.last.error as { code: string; message: string };
  assert.equal(err.code, "guest_error");
  assert.match(err.message, /start command exited with 3 .*cannot-start-here/s);
  // (Not the ready timeout's `timeout`: it failed as soon as the start command was seen to end.)
  const list = await api<{ snapshots: { tag: string }[] }>(d, "GET", "/v1/snapshots");
  assert.equal(
    list.snapshots.some((s) => s.tag === "img-bad"),
    false,
  );
});

step("the CLI makes one from the image, and forkd images shows where each came from", async () => {
  const r = await cli(d, [
    "snapshot",
    "--tag",
    "img-cli",
    "--image",
    REF,
    "--memory",
    "256",
    "--ready-cmd",
    "test -d /.forkd",
  ]);
  assert.equal(r.code, 0, r.stderr);
  const ls = await cli(d, ["images"]);
  assert.equal(ls.code, 0, ls.stderr);
  const short = digest.slice("sha256:".length, "sha256:".length + 12);
  assert.match(ls.stdout, new RegExp(`^img-cli +ready +- +image ${REF}@${short} `, "m"));
});

step("an image snapshot packs, and unpacks into a daemon with an empty image cache", async () => {
  const file = join(work, "img.forkd.tar.zst");
  const p = await cli(d, ["pack", "img", "-o", file]);
  assert.equal(p.code, 0, p.stderr);
  b = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_CACHE_DIR: join(work, "cache-b") });
  const u = await cli(b, ["unpack", file]);
  assert.equal(u.code, 0, u.stderr);
  const got = await api<{ source: unknown; image: { dir: string } }>(b, "GET", "/v1/snapshots/img");
  assert.deepEqual(got.source, { kind: "image", ref: REF, digest });
  assert.ok(got.image.dir.startsWith(join(work, "cache-b", "imported")), got.image.dir);
  const id = await forkOne(b, "img");
  const body = await sh(
    b,
    id,
    `python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/index.html', timeout=10).read().decode(), end='')"`,
  );
  assert.equal(body, ADDED["srv/app/index.html"]);
});
