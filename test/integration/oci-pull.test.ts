/**
 * Image pulls against a real registry (Debian's docker-registry on loopback), no VM: the
 * multi-layer image pulled and flattened with progress, a second ensure() that neither pulls nor
 * flattens (by digest: no request at all), layers shared between images fetched once (also
 * across gzip/zstd/plain variants of the same layer), concurrent ensure()s, a blob that does
 * not match its digest and a config that lies refused with nothing left in the cache, hostile
 * images refused, an anonymous bearer-token flow, the insecure-host rule, and the busybox and
 * Debian trees run in a chroot.
 */
import { test, after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { lstat, mkdtemp, readFile, readdir, rm, stat } from "node:fs/promises";
import { networkInterfaces, tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { ImagePuller } from "../../src/oci/puller.js";
import type { RegistrySettings } from "../../src/registry/client.js";
import type { ProgressDetail } from "../../src/util/progress.js";
import { ForkdError } from "../../src/util/errors.js";
import {
  MULTI_LAYER_EXPECT,
  TEST_CONFIG,
  corruptBlob,
  makeTar,
  multiLayerTars,
  pushDebianImage,
  pushHostileImages,
  pushImage,
  pushTestImages,
} from "../helpers/oci-images.js";
import type { TestImages } from "../helpers/oci-images.js";
import { startRegistry } from "../helpers/registry.js";
import type { TestRegistry } from "../helpers/registry.js";
import { startRegistryProxy } from "../helpers/registry-proxy.js";
import type { RegistryProxy } from "../helpers/registry-proxy.js";

const run = promisify(execFile);
let work: string;
let reg: TestRegistry;
let proxy: RegistryProxy;
let imgs: TestImages;
const closers: (() => Promise<void>)[] = [];

const settings = (insecureHosts: string[] = []): RegistrySettings => ({
  credentials: () => Promise.resolve(null),
  insecureHosts,
  chunkBytes: 64 << 20,
  idleMs: 30_000,
});
const puller = (name: string, insecureHosts: string[] = []) =>
  new ImagePuller({ cacheDir: join(work, name), settings: settings(insecureHosts) });
const via = (p: RegistryProxy, ref: string) => ref.replace(reg.host, p.host);

/** What the cache holds besides complete entries: nothing in tmp/, every rootfs complete. */
async function cacheState(name: string) {
  const oci = join(work, name, "oci");
  const ls = (d: string) => readdir(join(oci, d)).catch(() => [] as string[]);
  return { tmp: await ls("tmp"), layers: await ls("layers/sha256"), rootfs: await ls("rootfs/sha256") };
}

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-oci-it-"));
  reg = await startRegistry(work);
  closers.push(() => reg.stop());
  imgs = await pushTestImages(reg.host);
  proxy = await startRegistryProxy(reg.host);
  closers.push(() => proxy.close());
});

after(async () => {
  for (const c of closers.reverse()) await c().catch(() => undefined);
  await rm(work, { recursive: true, force: true });
});

test("pull: the multi-layer image is flattened, its config parsed, its progress reported", async () => {
  const p = puller("c1");
  const events: { m: string; d: ProgressDetail | undefined }[] = [];
  const ref = via(proxy, imgs.multi.ref);
  const r = await p.ensure(ref, (m, d) => events.push({ m, d }));
  assert.equal(r.digest, imgs.multi.digest);
  assert.equal(r.ref, ref);
  assert.deepEqual(r.config, {
    env: TEST_CONFIG.Env,
    workingDir: TEST_CONFIG.WorkingDir,
    user: TEST_CONFIG.User,
    entrypoint: null,
    cmd: TEST_CONFIG.Cmd,
    labels: TEST_CONFIG.Labels,
  });
  assert.ok(r.sizeBytes > 0);
  const x = MULTI_LAYER_EXPECT;
  for (const [f, content] of Object.entries(x.files))
    assert.equal(await readFile(join(r.rootfs, f), "utf8"), content);
  for (const f of x.absent) await assert.rejects(lstat(join(r.rootfs, f)));
  assert.equal(
    (await lstat(join(r.rootfs, "data/x-link"))).ino,
    (await lstat(join(r.rootfs, "data/x.txt"))).ino,
  );
  assert.equal((await lstat(join(r.rootfs, "usr/bin/suid"))).mode & 0o7777, 0o4755);
  const { stdout } = await run(
    "getfattr",
    ["-h", "--only-values", "-n", "security.capability", join(r.rootfs, "usr/bin/cap")],
    {
      encoding: "buffer",
    },
  );
  assert.deepEqual(stdout, x.xattrs["usr/bin/cap"]?.[1]);
  // Progress: every layer in the pull phase with its index, digest and bytes; then the flatten.
  const total = imgs.multi.layers.reduce((a, l) => a + l.size, 0);
  for (const [i, l] of imgs.multi.layers.entries()) {
    assert.ok(
      events.some(
        (e) =>
          e.d?.phase === "pull" &&
          e.d.layer?.index === i + 1 &&
          e.d.layer.count === 3 &&
          e.d.layer.path === l.digest,
      ),
      `layer ${i + 1} reported`,
    );
  }
  const pulls = events.filter((e) => e.d?.phase === "pull");
  assert.equal(pulls.at(-1)?.d?.done_bytes, total);
  assert.ok(pulls.every((e) => e.d?.total_bytes === total));
  assert.ok(events.some((e) => e.d?.phase === "flatten"));

  // A second ensure(): the manifest is read (a tag may move), nothing is fetched or flattened.
  const before = (await stat(r.rootfs)).ino;
  proxy.requests.length = 0;
  events.length = 0;
  const again = await p.ensure(ref, (m, d) => events.push({ m, d }));
  assert.equal(again.rootfs, r.rootfs);
  assert.equal((await stat(again.rootfs)).ino, before, "the same tree, not made again");
  assert.equal(proxy.blobGets(), 0, "no blob fetched");
  assert.ok(!events.some((e) => e.d?.phase === "pull" || e.d?.phase === "flatten"), JSON.stringify(events));
  // Another puller over the same cache (a restarted daemon) finds it too; by digest, with no request.
  proxy.requests.length = 0;
  const byDigest = await puller("c1").ensure(via(proxy, `${reg.host}/forkd-test/multi@${imgs.multi.digest}`));
  assert.equal(byDigest.rootfs, r.rootfs);
  assert.deepEqual(proxy.requests, [], "a cached image by digest needs no registry");
  assert.deepEqual((await cacheState("c1")).tmp, []);
});

test("pull: a layer shared by two images is fetched once; the same layer compressed otherwise is not fetched again", async () => {
  const [l1, l2] = multiLayerTars();
  assert.ok(l1 && l2);
  const a = await pushImage(reg.host, "forkd-test/shared", "a", [
    { tar: l1 },
    { tar: makeTar([{ name: "only-a", data: "a" }]) },
  ]);
  const b = await pushImage(reg.host, "forkd-test/shared", "b", [
    { tar: l1 },
    { tar: makeTar([{ name: "only-b", data: "b" }]) },
  ]);
  assert.equal(a.layers[0]?.digest, b.layers[0]?.digest);
  const p = puller("c2");
  proxy.requests.length = 0;
  const ra = await p.ensure(via(proxy, a.ref));
  const rb = await p.ensure(via(proxy, b.ref));
  assert.notEqual(ra.rootfs, rb.rootfs);
  assert.equal(proxy.blobGets(a.layers[0]?.digest), 1, "the shared layer is fetched once");
  assert.equal(proxy.blobGets(b.layers[1]?.digest), 1);
  await stat(join(rb.rootfs, "only-b"));
  await assert.rejects(stat(join(rb.rootfs, "only-a")));
  // gzip, then the same layers as zstd under an index, and plain under a Docker manifest list.
  await p.ensure(via(proxy, imgs.multi.ref));
  proxy.requests.length = 0;
  const z = await p.ensure(via(proxy, imgs.multiZstdIndex.ref));
  const d = await p.ensure(via(proxy, imgs.multiDockerList.ref));
  assert.equal(z.digest, imgs.multiZstdIndex.digest, "the index's linux/amd64 manifest");
  assert.equal(d.digest, imgs.multiDockerList.digest, "the manifest list's linux/amd64 manifest");
  for (const l of [...imgs.multiZstdIndex.layers, ...imgs.multiDockerList.layers])
    assert.equal(proxy.blobGets(l.digest), 0);
  for (const r of [z, d]) assert.equal(await readFile(join(r.rootfs, "etc/keep.txt"), "utf8"), "layer2\n");
});

test("pull: zstd and plain layers, from an index, into an empty cache", async () => {
  const p = puller("c2b");
  const z = await p.ensure(via(proxy, imgs.multiZstdIndex.ref));
  const d = await p.ensure(via(proxy, imgs.multiDockerList.ref));
  for (const r of [z, d]) {
    for (const [f, content] of Object.entries(MULTI_LAYER_EXPECT.files))
      assert.equal(await readFile(join(r.rootfs, f), "utf8"), content);
  }
  // By the index's digest too.
  assert.equal(
    (await p.ensure(via(proxy, imgs.multiZstdIndex.refByDigest))).digest,
    imgs.multiZstdIndex.digest,
  );
});

test("pull: concurrent ensure()s of one image (one puller, and two over the same cache) share the work", async () => {
  const p = puller("c3");
  const q = puller("c3");
  proxy.requests.length = 0;
  const ref = via(proxy, imgs.busybox.ref);
  const rs = await Promise.all([p.ensure(ref), p.ensure(ref), q.ensure(ref), p.ensure(ref)]);
  for (const r of rs) assert.equal(r.rootfs, rs[0]?.rootfs);
  const layer = imgs.busybox.layers[0]?.digest;
  assert.ok(
    proxy.blobGets(layer) >= 1 && proxy.blobGets(layer) <= 2,
    `fetched once per puller: ${proxy.blobGets(layer)}`,
  );
  const st = await cacheState("c3");
  assert.deepEqual(st.tmp, [], "nothing left in tmp/");
  assert.equal(st.rootfs.length, 1);
  assert.equal((await lstat(join(rs[0]?.rootfs ?? "", "bin/sh"))).isSymbolicLink(), true);
});

test("pull: a blob that does not match its digest, or a config that lies, is refused and nothing is left", async () => {
  const tar = makeTar([{ name: "tampered", data: "will not arrive\n" }]);
  const img = await pushImage(reg.host, "forkd-test/corrupt", "1", [{ tar }]);
  await corruptBlob(reg.blobPath(img.layers[0]?.digest ?? ""));
  const p = puller("c4");
  await assert.rejects(p.ensure(via(proxy, img.ref)), (e: unknown) => {
    assert.ok(e instanceof ForkdError && e.code === "invalid_argument", String(e));
    assert.match(e.message, /does not match its digest/);
    return true;
  });
  const lying = await pushImage(
    reg.host,
    "forkd-test/lying",
    "1",
    [{ tar: makeTar([{ name: "x", data: "x" }]) }],
    {
      diffIds: ["sha256:" + "0".repeat(64)],
    },
  );
  await assert.rejects(
    p.ensure(via(proxy, lying.ref)),
    /the uncompressed layer is sha256:[0-9a-f]{64}, the image config says sha256:0{64}/,
  );
  assert.deepEqual(await cacheState("c4"), { tmp: [], layers: [], rootfs: [] });
});

test("pull: hostile images are refused naming the entry, and nothing is left in the cache", async () => {
  const hostile = await pushHostileImages(reg.host);
  const p = puller("c5");
  for (const [name, h] of Object.entries(hostile)) {
    await assert.rejects(p.ensure(via(proxy, h.ref)), (e: unknown) => {
      assert.ok(e instanceof ForkdError && e.code === "invalid_argument", `${name}: ${String(e)}`);
      assert.ok(e.message.includes(`entry ${JSON.stringify(h.entry)}`), `${name}: ${e.message}`);
      assert.match(e.message, h.why);
      return true;
    });
  }
  const st = await cacheState("c5");
  assert.deepEqual(st.tmp, []);
  assert.deepEqual(st.rootfs, []);
  await assert.rejects(lstat("/tmp/pwned"), { code: "ENOENT" });
});

test("pull: an anonymous bearer-token flow (401, the challenge's realm, the token on every request)", async () => {
  const authed = await startRegistryProxy(reg.host, { bearer: true });
  closers.push(() => authed.close());
  const r = await puller("c6").ensure(via(authed, imgs.busybox.ref));
  assert.equal(r.digest, imgs.busybox.digest);
  assert.ok(authed.tokenRequests.length >= 1);
  const t = authed.tokenRequests[0];
  assert.equal(t?.get("service"), "forkd-test");
  assert.deepEqual(t?.getAll("scope"), ["repository:forkd-test/busybox:pull"]);
  assert.ok(
    authed.requests.some((q) => q.path.includes("/blobs/") && q.authorized),
    "blobs fetched with the token",
  );
  // A token service that refuses: a clear error.
  const refusing = await startRegistryProxy(reg.host, { bearer: true, refuseTokens: true });
  closers.push(() => refusing.close());
  await assert.rejects(
    puller("c6b").ensure(via(refusing, imgs.busybox.ref)),
    /the token service refused anonymous access \(HTTP 403\)/,
  );
});

test("pull: the operator's credentials are sent to the token service of a private repository", async () => {
  const creds = { username: "forkd", password: "s3cret" };
  const priv = await startRegistryProxy(reg.host, { bearer: true, tokenCredentials: creds });
  closers.push(() => priv.close());
  await assert.rejects(puller("c6c").ensure(via(priv, imgs.busybox.ref)), /refused anonymous access/);
  const asked: string[] = [];
  const withCreds = new ImagePuller({
    cacheDir: join(work, "c6d"),
    settings: {
      ...settings(),
      credentials: (host) => {
        asked.push(host);
        return Promise.resolve(host === priv.host ? creds : null);
      },
    },
  });
  const r = await withCreds.ensure(via(priv, imgs.busybox.ref));
  assert.equal(r.digest, imgs.busybox.digest);
  assert.deepEqual([...new Set(asked)], [priv.host]);
});

test("pull: plain http only to loopback or a host the operator marks insecure", async (t) => {
  const ip = Object.values(networkInterfaces())
    .flat()
    .find((a) => a && a.family === "IPv4" && !a.internal)?.address;
  if (!ip) {
    t.skip("no non-loopback IPv4 address on this host");
    return;
  }
  const open = await startRegistryProxy(reg.host, { listen: "0.0.0.0", advertise: ip });
  closers.push(() => open.close());
  const ref = via(open, imgs.busybox.ref);
  await assert.rejects(
    puller("c7").ensure(ref),
    (e: unknown) => e instanceof ForkdError && e.code === "unavailable",
  );
  assert.deepEqual(open.requests, [], "no plain-http request was made to a host not marked insecure");
  const r = await puller("c7", [open.host]).ensure(ref);
  assert.equal(r.digest, imgs.busybox.digest);
  assert.ok(open.requests.length > 0);
});

test(
  "pull: the busybox tree runs in a chroot",
  { skip: process.getuid?.() !== 0 && "needs root (chroot)" },
  async () => {
    const r = await puller("c3").ensure(via(proxy, imgs.busybox.ref));
    const { stdout } = await run("chroot", [
      r.rootfs,
      "/bin/sh",
      "-c",
      "echo hello from busybox; ls /usr/bin | wc -l",
    ]);
    assert.match(stdout, /^hello from busybox\n\d+\n$/);
  },
);

test(
  "pull: the Debian tree from the debootstrap tarball (python3 + numpy)",
  { timeout: 600_000 },
  async () => {
    const deb = await pushDebianImage(reg.host);
    const r = await puller("c8").ensure(via(proxy, deb.ref));
    assert.ok(r.sizeBytes > 100 << 20, String(r.sizeBytes));
    assert.equal((await lstat(join(r.rootfs, "usr/bin/passwd"))).mode & 0o4000, 0o4000, "setuid kept");
    if (process.getuid?.() === 0) {
      const { stdout } = await run("chroot", [
        r.rootfs,
        "/usr/bin/python3",
        "-c",
        "import numpy; print(numpy.__name__)",
      ]);
      assert.equal(stdout, "numpy\n");
    }
  },
);

test("pull: an image over the byte bound, or a cancelled pull, leaves nothing behind", async () => {
  const big = await pushImage(reg.host, "forkd-test/big", "1", [
    { tar: makeTar([{ name: "zeros", data: Buffer.alloc(4 << 20) }]), compression: "zstd" },
  ]);
  const small = new ImagePuller({
    cacheDir: join(work, "c9"),
    settings: settings(),
    limits: { maxBytes: 1 << 20, maxEntries: 1000 },
  });
  await assert.rejects(small.ensure(via(proxy, big.ref)), (e: unknown) => {
    assert.ok(e instanceof ForkdError && e.code === "payload_too_large", String(e));
    assert.match(e.message, /expands to more than 1048576 bytes/);
    return true;
  });
  assert.deepEqual(await cacheState("c9"), { tmp: [], layers: [], rootfs: [] });
  // Cancelled as the first layer starts: refused, nothing kept; a later ensure() completes.
  const ac = new AbortController();
  const p = puller("c10");
  await assert.rejects(
    p.ensure(
      via(proxy, imgs.multi.ref),
      (_m, d) => {
        if (d?.phase === "pull") ac.abort(new ForkdError("timeout", "cancelled by the test"));
      },
      ac.signal,
    ),
    /cancelled by the test/,
  );
  assert.deepEqual(await cacheState("c10"), { tmp: [], layers: [], rootfs: [] });
  const ac2 = new AbortController();
  await assert.rejects(
    p.ensure(
      via(proxy, imgs.multi.ref),
      (_m, d) => {
        if (d?.phase === "flatten") ac2.abort(new ForkdError("timeout", "cancelled in the flatten"));
      },
      ac2.signal,
    ),
    /cancelled in the flatten/,
  );
  const st = await cacheState("c10");
  assert.deepEqual([st.tmp, st.rootfs], [[], []]);
  assert.equal(st.layers.length, 3, "verified layers stay cached");
  assert.ok((await p.ensure(via(proxy, imgs.multi.ref))).sizeBytes > 0);
  // Two callers of one pull: the one that started it cancels once the second joined (its
  // blobs come slowly); the other still gets the image. And a caller that joined someone's
  // pull may stop waiting on its own signal.
  const slow = await startRegistryProxy(reg.host, { blobDelayMs: 1500 });
  closers.push(() => slow.close());
  const q = puller("c11");
  const ac3 = new AbortController();
  let second: Promise<unknown> | undefined;
  const first = q.ensure(
    via(slow, imgs.busybox.ref),
    (_m, d) => {
      if (d?.phase !== "pull" || second) return;
      second = q.ensure(via(slow, imgs.busybox.ref));
      setTimeout(() => ac3.abort(new ForkdError("timeout", "the first caller cancelled")), 500);
    },
    ac3.signal,
  );
  await assert.rejects(first, /the first caller cancelled/);
  assert.ok(second);
  assert.ok(((await second) as { sizeBytes: number }).sizeBytes > 0, "the second caller got the image");
  assert.equal(slow.blobGets(imgs.busybox.layers[0]?.digest), 2, "the layer was asked for again");
  const ac4 = new AbortController();
  const r = puller("c12");
  let joined: Promise<unknown> | undefined;
  const starter = r.ensure(via(slow, imgs.multi.ref), (_m, d) => {
    if (d?.phase !== "pull" || joined) return;
    joined = r.ensure(via(slow, imgs.multi.ref), undefined, ac4.signal);
    joined.catch(() => undefined); // checked below
    setTimeout(() => ac4.abort(new ForkdError("timeout", "the joined caller stopped waiting")), 500);
  });
  assert.ok((await starter).sizeBytes > 0, "the starter was not cancelled by the joined caller");
  assert.ok(joined);
  await assert.rejects(joined, /the joined caller stopped waiting/);
});
