/**
 * Snapshots between nodes without a VM: fake but complete chains (real qcow2 layers, a diff
 * branch of a tenant's over a shared base) served by the peer routes (src/peer/) on loopback
 * and pulled into other scratch stores (src/snapshot/peer-pull.ts).
 *
 * The manifest names the chain by store keys with their owners and every file with its sum;
 * the routes take the cluster's peer bearer and nothing else (no API token); a blob is served
 * by sha256 only when it is a held snapshot's or image's file, with Range. A pull registers the
 * chain under the same keys and owners, the image by content address, downloads only what the
 * node lacks (a branch: its own files), resumes a cut file from the next holder with Range (or
 * starts a holder's own disk layer again), refuses peers that lie, send too much, stall or
 * trickle (within bounds, leaving nothing), and two concurrent pulls of one key are one.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { chmod, readdir, readFile, stat, writeFile } from "node:fs/promises";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { createAdaptorServer } from "@hono/node-server";
import { ClusterSecret, PEER_PURPOSE } from "../../src/access/cluster-secret.js";
import { readAccessConfig } from "../../src/daemon/config.js";
import { createPeerApp } from "../../src/peer/app.js";
import { byteRange } from "../../src/peer/range.js";
import { FileSums } from "../../src/snapshot/file-sums.js";
import { heldFile } from "../../src/snapshot/held-files.js";
import { sha256File } from "../../src/snapshot/meta.js";
import type { UnpackDeps } from "../../src/snapshot/pack.js";
import { parsePeerManifest, peerManifest } from "../../src/snapshot/peer-manifest.js";
import type { PeerManifest } from "../../src/snapshot/peer-manifest.js";
import { PEER_PULL_DEFAULTS, PeerPuller } from "../../src/snapshot/peer-pull.js";
import type { Holder, PeerPullOptions } from "../../src/snapshot/peer-pull.js";
import { memoryDiffFile } from "../../src/snapshot/store.js";
import { jsonLogger } from "../../src/util/log.js";
import { PAGES, PSZ, baseSnapshot, diffOf, diffSnapshot, scratch } from "../helpers/fake-chain.js";
import type { Scratch } from "../helpers/fake-chain.js";
import { startPeerProxy } from "../helpers/peer-proxy.js";
import type { BlobFault, PeerProxy } from "../helpers/peer-proxy.js";
import { testTools } from "../helpers/tools.js";

const { tools, release } = await testTools();
after(release);
const SECRET = ClusterSecret.of(Buffer.from("s".repeat(40)));
const BEARER = SECRET.bearer(PEER_PURPOSE);
const sums = new FileSums();
// A memory image of 4 MiB that is not all zero (holes are written as holes, hashed as zeros).
const MEM = Buffer.alloc(PSZ * PAGES, 0x11);
const RUNS = [{ page: 7, data: Buffer.alloc(PSZ * 3, 0xaa) }];
const RUNS2 = [...RUNS, { page: 90, data: Buffer.alloc(PSZ, 0xbb) }];

const servers: Server[] = [];
const proxies: PeerProxy[] = [];
const scratches: Scratch[] = [];
after(async () => {
  for (const p of proxies) await p.close();
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  for (const s of scratches) await s.done();
});

/** A node holding py (shared) and alice/app (alice's diff branch of it). */
async function sourceNode(): Promise<Scratch> {
  const s = await scratch("forkd-peer-src-");
  scratches.push(s);
  const py = await baseSnapshot(s, "py", MEM);
  await diffSnapshot(s, "alice/app", py, py, diffOf(RUNS), "alice");
  return s;
}

async function emptyNode(): Promise<Scratch> {
  const s = await scratch("forkd-peer-dst-");
  scratches.push(s);
  return s;
}

const depsOf = (s: Scratch, o: Partial<UnpackDeps> = {}): UnpackDeps => ({
  store: s.store,
  cacheDir: join(s.root, "cache"),
  accel: "tcg",
  viewer: null,
  tools,
  ...o,
});

const peerApp = (s: Scratch) =>
  createPeerApp({
    snapshots: {
      peerManifest: (k: string) => peerManifest(s.store, k, sums),
      heldFile: (h: string) => heldFile(s.store, sums, h),
    },
    secret: SECRET,
    log: jsonLogger("test"),
  });

/** The peer routes of `s` on loopback: its URL. */
async function servePeer(s: Scratch): Promise<string> {
  const server = createAdaptorServer({ fetch: peerApp(s).fetch }) as Server;
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function proxyOf(url: string, fault: BlobFault = { kind: "none" }): Promise<PeerProxy> {
  const p = await startPeerProxy(url, fault);
  proxies.push(p);
  return p;
}

const puller = (o: Partial<PeerPullOptions> = {}) =>
  new PeerPuller({ ...PEER_PULL_DEFAULTS, bearer: BEARER, idleMs: 2_000, rounds: 1, ...o });

const holders =
  (...urls: string[]) =>
  (): Promise<Holder[]> =>
    Promise.resolve(urls.map((url, i) => ({ node: `n${i}`, url })));

const sha = (b: Buffer | string) => createHash("sha256").update(b).digest("hex");

const get = (
  s: Scratch,
  path: string,
  headers: Record<string, string> = { authorization: `Bearer ${BEARER}` },
) => peerApp(s).request(path, { headers });

/** Nothing registered and nothing staged in `s`. */
async function untouched(s: Scratch): Promise<void> {
  assert.deepEqual(await s.store.list(), []);
  assert.deepEqual(
    (await readdir(s.store.root)).filter((n) => n.startsWith(".")),
    [],
  );
}

test("the manifest names the chain by store keys with owners, and every file with its sum", async () => {
  const s = await sourceNode();
  const r = await get(s, "/peer/v1/snapshots/alice%2Fapp/manifest");
  assert.equal(r.status, 200);
  const m = parsePeerManifest(await r.text());
  assert.equal(m.tag, "alice/app");
  assert.deepEqual(m.chain, ["py", "alice/app"]);
  assert.deepEqual(m.owners, [null, "alice"]);
  // The key's "/" may also come as it is.
  assert.deepEqual(
    ((await (await get(s, "/peer/v1/snapshots/alice/app/manifest")).json()) as PeerManifest).chain,
    m.chain,
  );
  const app = s.store.filesFor("alice/app");
  const py = s.store.filesFor("py");
  assert.deepEqual(Object.keys(m.files).sort(), [
    "image/initrd.img",
    "image/manifest.json",
    "image/rootfs.ext4",
    "image/vmlinuz",
    "snapshots/alice~app/disk.qcow2",
    "snapshots/alice~app/memory.diff",
    "snapshots/alice~app/meta.json",
    "snapshots/alice~app/vmstate",
    "snapshots/py/disk.qcow2",
    "snapshots/py/memory",
    "snapshots/py/meta.json",
    "snapshots/py/vmstate",
  ]);
  // As this node has them: meta.json as it is (full keys), disk layers with this node's paths.
  assert.deepEqual(m.files["snapshots/alice~app/meta.json"], await sha256File(app.meta));
  assert.deepEqual(m.files["snapshots/alice~app/memory.diff"], await sha256File(memoryDiffFile(app.dir)));
  assert.deepEqual(m.files["snapshots/py/disk.qcow2"], await sha256File(py.disk));
  assert.deepEqual(m.files["image/rootfs.ext4"], await sha256File(join(s.imageDir, "rootfs.ext4")));
  assert.match(await readFile(app.meta, "utf8"), /"tag": ?"alice\/app"/);

  const missing = await get(s, "/peer/v1/snapshots/nope/manifest");
  assert.equal(missing.status, 404);
  assert.equal(((await missing.json()) as { error: { code: string } }).error.code, "not_found");
  assert.equal((await get(s, "/peer/v1/snapshots/..%2F..%2Fetc/manifest")).status, 400);
});

test("a peer manifest is refused when its owners, keys or files are not a chain's", () => {
  const base: PeerManifest = {
    format: "forkd-peer/1",
    created: "now",
    tag: "alice/app",
    chain: ["alice/app"],
    owners: ["alice"],
    image: { hash: "ab".repeat(32), template: "python", kernelVersion: "6" },
    files: Object.fromEntries(
      [
        "image/vmlinuz",
        "image/initrd.img",
        "image/rootfs.ext4",
        "image/manifest.json",
        "snapshots/alice~app/memory",
        "snapshots/alice~app/vmstate",
        "snapshots/alice~app/disk.qcow2",
        "snapshots/alice~app/meta.json",
      ].map((p) => [p, { size: 1, sha256: "cd".repeat(32) }]),
    ),
  };
  assert.equal(parsePeerManifest(JSON.stringify(base)).tag, "alice/app");
  const refused = (edit: (m: PeerManifest) => unknown, re: RegExp) =>
    assert.throws(() => parsePeerManifest(JSON.stringify(edit(structuredClone(base)))), re);
  refused((m) => ({ ...m, owners: ["alice", null] }), /one owner per snapshot/);
  refused((m) => ({ ...m, format: "forkd-pack/1" }), /format/);
  refused((m) => ({ ...m, chain: ["../x"], tag: "../x" }), /bad tag/);
  refused(
    (m) => ({
      ...m,
      files: { ...m.files, "snapshots/alice~app/../../x": { size: 1, sha256: "cd".repeat(32) } },
    }),
    /unexpected path/,
  );
  refused(
    (m) => ({
      ...m,
      files: { ...m.files, "snapshots/alice~app/meta.json": { size: 1 << 30, sha256: "cd".repeat(32) } },
    }),
    /too large/,
  );
  refused((m) => ({ ...m, extra: 1 }), /invalid/);
});

test("the peer routes take the cluster's peer bearer and nothing else", async () => {
  const s = await sourceNode();
  const path = "/peer/v1/snapshots/py/manifest";
  for (const authorization of [
    undefined,
    "",
    `Bearer ${"s".repeat(40)}`, // the secret itself
    `Bearer ${SECRET.bearer("forkd-gateway/1")}`, // another purpose's
    `Bearer ${ClusterSecret.of(Buffer.from("t".repeat(40))).bearer(PEER_PURPOSE)}`, // another cluster's
    "Bearer fkd_admin_0123456789abcdef0123456789abcdef", // an API token
    `Basic ${BEARER}`,
    `Bearer ${BEARER.toUpperCase()}`,
  ]) {
    const r = await get(s, path, authorization === undefined ? {} : { authorization });
    assert.equal(r.status, 401, String(authorization));
    assert.equal(((await r.json()) as { error: { code: string } }).error.code, "unauthenticated");
    assert.match(r.headers.get("www-authenticate") ?? "", /^Bearer/);
  }
  assert.equal((await get(s, path)).status, 200);
  // Also a blob, and a route that does not exist, need it first.
  assert.equal((await get(s, `/peer/v1/blobs/sha256:${"0".repeat(64)}`, {})).status, 401);
  assert.equal((await get(s, "/peer/v1/nothing", {})).status, 401);
});

test("a cluster secret file must be its owner's alone and at least 32 bytes", async () => {
  const s = await emptyNode();
  const file = join(s.root, "secret");
  await writeFile(file, `${"k".repeat(32)}\n`, { mode: 0o600 });
  const ok = await ClusterSecret.read(file);
  // The trailing newline is not part of it: the same bearer as the 32 bytes alone.
  assert.equal(ok.bearer(PEER_PURPOSE), ClusterSecret.of(Buffer.from("k".repeat(32))).bearer(PEER_PURPOSE));
  await chmod(file, 0o640);
  await assert.rejects(ClusterSecret.read(file), /mode 640 lets others read it: chmod 600/);
  await writeFile(file, `${"k".repeat(31)}\n\n`, { mode: 0o600 });
  await chmod(file, 0o600);
  await assert.rejects(ClusterSecret.read(file), /holds 31 bytes; a cluster secret needs at least 32/);
  await assert.rejects(ClusterSecret.read(join(s.root, "none")), /cannot be read: ENOENT/);
  await assert.rejects(ClusterSecret.read(s.root), /not a regular file/);
  // The daemon reads it once, with its other settings: a bad one stops the start.
  await assert.rejects(
    readAccessConfig({ FORKD_CLUSTER_SECRET_FILE: file }, s.root),
    /FORKD_CLUSTER_SECRET_FILE .*holds 31 bytes/,
  );
  await writeFile(file, "k".repeat(64), { mode: 0o600 });
  const cfg = await readAccessConfig({ FORKD_CLUSTER_SECRET_FILE: file, FORKD_PEER_IDLE_MS: "5000" }, s.root);
  assert.equal(cfg.cluster?.peerIdleMs, 5000);
  assert.equal(
    cfg.cluster?.secret.bearer(PEER_PURPOSE),
    ClusterSecret.of(Buffer.from("k".repeat(64))).bearer(PEER_PURPOSE),
  );
  assert.equal((await readAccessConfig({}, s.root)).cluster, null);
  await assert.rejects(
    readAccessConfig({ FORKD_CLUSTER_SECRET_FILE: file, FORKD_PEER_IDLE_MS: "x" }, s.root),
    /FORKD_PEER_IDLE_MS/,
  );
});

test("Range: bytes=N-, N-M and -N; anything else is the whole file; past the end is 416", () => {
  assert.deepEqual(byteRange("bytes=10-", 100), { start: 10, end: 99 });
  assert.deepEqual(byteRange("bytes=10-19", 100), { start: 10, end: 19 });
  assert.deepEqual(byteRange("bytes=10-1000", 100), { start: 10, end: 99 });
  assert.deepEqual(byteRange("bytes=-5", 100), { start: 95, end: 99 });
  assert.deepEqual(byteRange("bytes=0-", 100), { start: 0, end: 99 });
  for (const h of [undefined, "", "bytes=", "bytes=-", "bytes=1-2,4-5", "items=1-", "bytes=5-2", "bytes=x-"])
    assert.equal(byteRange(h, 100), null, String(h));
  assert.equal(byteRange("bytes=100-", 100), "unsatisfiable");
  assert.equal(byteRange("bytes=-0", 100), "unsatisfiable");
  assert.equal(byteRange("bytes=0-", 0), "unsatisfiable");
});

test("a blob is a held file's bytes by sha256, whole or from a byte on; nothing else is reachable", async () => {
  const s = await sourceNode();
  const memory = s.store.filesFor("py").memory;
  const bytes = await readFile(memory);
  const whole = await get(s, `/peer/v1/blobs/sha256:${sha(bytes)}`);
  assert.equal(whole.status, 200);
  assert.equal(whole.headers.get("content-length"), String(bytes.length));
  assert.ok(Buffer.from(await whole.arrayBuffer()).equals(bytes));
  const from = (n: number) =>
    get(s, `/peer/v1/blobs/sha256:${sha(bytes)}`, {
      authorization: `Bearer ${BEARER}`,
      range: `bytes=${n}-`,
    });
  const part = await from(4097);
  assert.equal(part.status, 206);
  assert.equal(part.headers.get("content-range"), `bytes 4097-${bytes.length - 1}/${bytes.length}`);
  assert.equal(part.headers.get("content-length"), String(bytes.length - 4097));
  assert.ok(Buffer.from(await part.arrayBuffer()).equals(bytes.subarray(4097)));
  const past = await from(bytes.length);
  assert.equal(past.status, 416);
  assert.equal(past.headers.get("content-range"), `bytes */${bytes.length}`);
  // Every kind of held file: metadata, an image's file, a diff, a disk layer.
  const app = s.store.filesFor("alice/app");
  for (const f of [app.meta, join(s.imageDir, "manifest.json"), memoryDiffFile(app.dir), app.disk]) {
    const r = await get(s, `/peer/v1/blobs/sha256:${(await sha256File(f)).sha256}`);
    assert.equal(r.status, 200, f);
    assert.ok(Buffer.from(await r.arrayBuffer()).equals(await readFile(f)), f);
  }
  // A file of the host (even one in the store's directory, or the image's provenance-like
  // neighbours) is not held: 404 by its sum.
  await writeFile(join(app.dir, "stray"), "not a snapshot file");
  for (const f of ["/etc/hostname", join(app.dir, "stray"), join(app.dir, "child.qcow2")]) {
    const r = await get(s, `/peer/v1/blobs/sha256:${(await sha256File(f)).sha256}`);
    assert.equal(r.status, 404, f);
  }
  assert.equal((await get(s, `/peer/v1/blobs/sha256:${"A".repeat(64)}`)).status, 400);
  assert.equal((await get(s, `/peer/v1/blobs/${"a".repeat(64)}`)).status, 400);
});

test("a pull registers the chain and its image with the same keys and owners; a branch then ships only its own files", async () => {
  const s = await sourceNode();
  const t = await emptyNode();
  const p = await proxyOf(await servePeer(s));
  let counted = 0;
  const pulls = puller({ onBytes: (n) => (counted += n) });
  const lines: string[] = [];
  const r = await pulls.pull(depsOf(t), "alice/app", holders(p.url), (l) => lines.push(l));
  assert.deepEqual(r.published, ["py", "alice/app"]);
  assert.equal(r.tag, "alice/app");
  assert.deepEqual(r.from, ["n0"]);
  assert.equal(r.files.total, 12);
  assert.equal(r.files.downloaded, 12, "an empty node: everything, the image too");
  assert.equal(counted, r.bytes.downloaded, "the counter of peer-pulled bytes");
  const here = await t.store.get("alice/app");
  assert.equal(here.meta.owner, "alice");
  assert.equal((await t.store.get("py")).meta.owner ?? null, null);
  assert.equal(here.meta.parent?.tag, "py");
  assert.equal(here.meta.memoryBase?.tag, "py");
  assert.match(here.meta.image.dir, new RegExp(`^${t.root}/cache/imported/[0-9a-f]{64}$`));
  assert.ok((await readFile(here.files.memoryDiff ?? "")).equals(diffOf(RUNS)));
  assert.ok((await readFile(here.files.memory)).equals(MEM));
  assert.ok(
    lines.some((l) => /alice~app\/memory\.diff: downloaded/.test(l)),
    lines.join("\n"),
  );
  assert.deepEqual(
    (await readdir(t.store.root)).filter((n) => n.startsWith(".")),
    [],
    "nothing staged",
  );

  // A branch of alice/app made on the source: only its own files (and the chain's metadata).
  const app = await s.store.get("alice/app");
  await diffSnapshot(s, "alice/app2", app.meta, (await s.store.get("py")).meta, diffOf(RUNS2), "alice");
  const before = p.blobGets().length;
  const b = await pulls.pull(depsOf(t), "alice/app2", holders(p.url));
  assert.deepEqual(b.published, ["alice/app2"]);
  const got = b.bytes.files.map((f) => f.path).sort();
  assert.deepEqual(got, [
    "snapshots/alice~app/meta.json",
    "snapshots/alice~app2/disk.qcow2",
    "snapshots/alice~app2/memory.diff",
    "snapshots/alice~app2/meta.json",
    "snapshots/alice~app2/vmstate",
    "snapshots/py/meta.json",
  ]);
  assert.equal(p.blobGets().length - before, got.length);
  const own = s.store.filesFor("alice/app2");
  let ownBytes = 0;
  for (const f of [memoryDiffFile(own.dir), own.vmstate, own.disk, own.meta])
    ownBytes += (await stat(f)).size;
  assert.ok(b.bytes.downloaded < ownBytes + 16 * 1024, `${b.bytes.downloaded} vs its own ${ownBytes}`);
  assert.ok(b.bytes.downloaded < MEM.length / 4, "not the parent's memory");
  assert.equal((await t.store.get("alice/app2")).meta.owner, "alice");
  // Pulled again: here already, nothing asked of the peer.
  const again = await pulls.pull(depsOf(t), "alice/app2", holders(p.url));
  assert.deepEqual([again.published, again.bytes.downloaded], [[], 0]);
});

test("a cut file resumes from the next holder with Range; a holder's own disk layer starts again", async () => {
  const a = await sourceNode();
  const b = await emptyNode();
  const c = await emptyNode();
  const aUrl = await servePeer(a);
  // b pulls from a first: it then holds the chain with its own disk layers and metadata.
  await puller().pull(depsOf(b), "alice/app", holders(aUrl));
  const CUT = 5000;
  const cut = await proxyOf(aUrl, { kind: "cut", bytes: CUT });
  const bp = await proxyOf(await servePeer(b));
  const r = await puller().pull(depsOf(c), "alice/app", holders(cut.url, bp.url));
  assert.deepEqual(r.published, ["py", "alice/app"]);
  assert.deepEqual(r.from, ["n0", "n1"]);
  const memSum = sha(MEM);
  // The memory image (the same file on both): its rest from byte CUT on the second holder.
  assert.deepEqual(
    bp.blobGets(memSum).map((g) => g.range),
    [`bytes=${CUT}-`],
  );
  const mem = r.bytes.files.find((f) => f.path === "snapshots/py/memory");
  assert.equal(mem?.bytes, MEM.length, "each byte of it once");
  // The disk layer is each node's own: b's whole, after a's first CUT bytes.
  const bDisk = await sha256File(b.store.filesFor("py").disk);
  assert.notEqual(bDisk.sha256, (await sha256File(a.store.filesFor("py").disk)).sha256);
  assert.deepEqual(
    bp.blobGets(bDisk.sha256).map((g) => g.range),
    [null],
  );
  assert.equal(r.bytes.files.find((f) => f.path === "snapshots/py/disk.qcow2")?.bytes, CUT + bDisk.size);
  const got = await c.store.get("alice/app");
  assert.ok((await readFile(got.files.memory)).equals(MEM));
  assert.equal(got.meta.owner, "alice");
});

test("peers that lie, send too much, stall or trickle are refused within bounds; another holder serves", async () => {
  const s = await sourceNode();
  const url = await servePeer(s);
  const cases: { fault: BlobFault; re: RegExp; o?: Partial<PeerPullOptions> }[] = [
    { fault: { kind: "corrupt", at: 100 }, re: /does not match its sha256/ },
    { fault: { kind: "extra", bytes: 10 }, re: /more than its \d+ bytes/ },
    { fault: { kind: "length" }, re: /announces \d+ bytes/ },
    { fault: { kind: "error" }, re: /: 500/ },
    { fault: { kind: "stall", bytes: 10 }, re: /no progress for 0\.3 s/, o: { idleMs: 300 } },
    {
      fault: { kind: "trickle", everyMs: 50 },
      re: /slower than 4096 bytes\/s/,
      o: { minRate: 4096, graceMs: 300 },
    },
  ];
  for (const { fault, re, o } of cases) {
    const bad = await proxyOf(url, fault);
    const t = await emptyNode();
    const began = Date.now();
    await assert.rejects(puller(o).pull(depsOf(t), "py", holders(bad.url)), re, fault.kind);
    assert.ok(Date.now() - began < 20_000, `${fault.kind}: bounded`);
    await untouched(t);
    // With a good holder after it, the pull succeeds.
    const r = await puller(o).pull(depsOf(t), "py", holders(bad.url, url));
    assert.deepEqual(r.published, ["py"], fault.kind);
    assert.ok((await readFile((await t.store.get("py")).files.memory)).equals(MEM));
  }
});

test("a manifest that lies about sizes is refused before anything is downloaded", async () => {
  const s = await sourceNode();
  const real = (await (await get(s, "/peer/v1/snapshots/py/manifest")).json()) as PeerManifest;
  const lying = async (m: PeerManifest): Promise<string> => {
    const app = createPeerApp({
      snapshots: {
        peerManifest: () => Promise.resolve(m),
        heldFile: (h: string) => heldFile(s.store, sums, h),
      },
      secret: SECRET,
      log: jsonLogger("test"),
    });
    const server = createAdaptorServer({ fetch: app.fetch }) as Server;
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  };
  const t = await emptyNode();
  // Larger than the node may write: refused before a blob is asked for.
  const huge = structuredClone(real);
  huge.files["snapshots/py/memory"] = {
    size: 2 ** 40,
    sha256: real.files["snapshots/py/memory"]?.sha256 ?? "",
  };
  const hp = await proxyOf(await lying(huge));
  await assert.rejects(
    puller().pull(depsOf(t, { maxBytes: 64 << 20 }), "py", holders(hp.url)),
    /more than the \d+ bytes/,
  );
  assert.equal(hp.blobGets().length, 0);
  await untouched(t);
  // Smaller than the file: the holder's bytes run past it.
  const small = structuredClone(real);
  const mem = small.files["snapshots/py/memory"];
  if (mem) mem.size = 1000;
  await assert.rejects(
    puller().pull(depsOf(t), "py", holders(await lying(small))),
    /announces \d+ bytes, not 1000/,
  );
  await untouched(t);
  // The manifest of another key than asked.
  await assert.rejects(
    puller().pull(depsOf(t), "other", holders(await lying(real))),
    /answered the manifest of py for other/,
  );
});

test("two concurrent pulls of one key are one download (and one pull counted)", async () => {
  const s = await sourceNode();
  const t = await emptyNode();
  const p = await proxyOf(await servePeer(s));
  const counted: string[] = [];
  const pulls = puller({ onPull: (r) => counted.push(r) });
  const [one, two] = await Promise.all([
    pulls.pull(depsOf(t), "alice/app", holders(p.url)),
    pulls.pull(depsOf(t), "alice/app", holders(p.url)),
  ]);
  assert.deepEqual(one, two);
  assert.deepEqual(one.published, ["py", "alice/app"]);
  assert.equal(p.blobGets().length, 12, "each file once");
  assert.equal(p.requests.filter((r) => r.path.endsWith("/manifest")).length, 1);
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(counted, ["ok"]);
  // Pulled again: it is here; nothing happened, nothing is counted.
  await pulls.pull(depsOf(t), "alice/app", holders(p.url));
  await assert.rejects(pulls.pull(depsOf(t), "nobody/nothing", holders()));
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(counted, ["ok", "failed"]);
  // A pull of the base while the branch's is in flight waits for it, and downloads nothing.
  const u = await emptyNode();
  const q = await proxyOf(await servePeer(s));
  const [branch, base] = await Promise.all([
    pulls.pull(depsOf(u), "alice/app", holders(q.url)),
    (async () => {
      await new Promise((r) => setImmediate(r));
      return pulls.pull(depsOf(u), "py", holders(q.url));
    })(),
  ]);
  assert.deepEqual(branch.published, ["py", "alice/app"]);
  assert.deepEqual(base.published, []);
  assert.equal(q.blobGets().length, 12);
});
