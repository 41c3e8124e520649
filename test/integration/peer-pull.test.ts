/**
 * Snapshots between two real daemons on this machine, by the peer routes (src/peer/): each
 * daemon has its own data dir, the second an empty image cache, both the same cluster secret.
 * A tenant's snapshot made on the first is pulled to the second with its guest image (same key,
 * same owner), forked and run there; a branch made on the first then ships only its own files;
 * a pull whose connection is cut mid-file resumes from a second holder with Range; two
 * concurrent pulls of one key are one download. The peer routes answer the cluster's peer
 * bearer only (never an API token), and the peer bearer opens nothing of the API.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { createHmac, randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { api, forkOne, sh } from "../helpers/vm.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { freePort } from "../helpers/port.js";
import { startPeerProxy } from "../helpers/peer-proxy.js";
import type { PeerProxy } from "../helpers/peer-proxy.js";
import { parseMetrics, value } from "../helpers/prometheus.js";
import { rawRequest, readAll } from "../helpers/http.js";
import { steps } from "../helpers/steps.js";

const { step, failed } = steps();
const SECRET = randomBytes(32).toString("hex");
const PEER_BEARER = createHmac("sha256", SECRET).update("forkd-peer/1").digest("hex");
const ADMIN = `it-${randomBytes(24).toString("base64url")}`;
let work: string;
let a: TestDaemon;
let b: TestDaemon;
let aUrl: string;
const proxies: PeerProxy[] = [];

interface Pulled {
  tag: string;
  published: string[];
  source: string;
  blobs: { total: number; downloaded: number; reused: number };
  bytes: { downloaded: number; files?: { path: string; bytes: number }[] };
}
interface Meta {
  owner?: string | null;
  files: { memory: { size: number; sha256: string } };
}

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-peer-it-"));
  const secret = join(work, "cluster.secret");
  await writeFile(secret, `${SECRET}\n`, { mode: 0o600 });
  const pa = await freePort();
  aUrl = `http://127.0.0.1:${pa}`;
  a = await makeDaemon({
    FORKD_POOL_SIZE: "0",
    FORKD_LISTEN: `127.0.0.1:${pa}`,
    FORKD_TOKEN: ADMIN,
    FORKD_CLUSTER_SECRET_FILE: secret,
  });
  b = await makeDaemon({
    FORKD_POOL_SIZE: "0",
    FORKD_LISTEN: `127.0.0.1:${await freePort()}`,
    FORKD_CLUSTER_SECRET_FILE: secret,
    // Empty: the guest image travels with the first pull.
    FORKD_CACHE_DIR: join(work, "cache-b"),
    FORKD_PEER_IDLE_MS: "10000",
  });
});

after(async () => {
  for (const p of proxies) await p.close();
  await a?.destroy(failed());
  await b?.destroy(failed());
  if (failed()) process.stderr.write(`peer-pull test artefacts kept in ${work}\n`);
  else await rm(work, { recursive: true, force: true });
});

/** A snapshot's metadata on a daemon's disk (key alice/x in directory alice~x). */
const metaOf = async (d: TestDaemon, key: string): Promise<Meta> =>
  JSON.parse(
    await readFile(join(d.dataDir, "snapshots", key.replace("/", "~"), "meta.json"), "utf8"),
  ) as Meta;

/** Bytes of a snapshot's own files on a daemon's disk. */
async function ownBytes(d: TestDaemon, key: string, files: string[]): Promise<number> {
  let n = 0;
  for (const f of files) n += (await stat(join(d.dataDir, "snapshots", key.replace("/", "~"), f))).size;
  return n;
}

/** Pulls `key` into b from `peer` (one URL or several), timing it. */
async function pull(key: string, peer: string | string[]): Promise<Pulled & { seconds: number }> {
  const t0 = Date.now();
  const r = await api<Pulled>(b, "POST", "/v1/snapshots/pull", { peer, tag: key });
  const seconds = (Date.now() - t0) / 1000;
  const mib = (r.bytes.downloaded / 2 ** 20).toFixed(1);
  process.stderr.write(
    `pull of ${key}: ${mib} MiB in ${seconds.toFixed(1)} s (${r.blobs.downloaded} files)\n`,
  );
  return { ...r, seconds };
}

const peerGet = (path: string, authorization?: string) =>
  fetch(`${aUrl}${path}`, authorization ? { headers: { authorization } } : {});

async function proxy(fault: Parameters<typeof startPeerProxy>[1] = { kind: "none" }): Promise<PeerProxy> {
  const p = await startPeerProxy(aUrl, fault);
  proxies.push(p);
  return p;
}

async function pulledBytes(d: TestDaemon): Promise<number> {
  const res = await rawRequest(d.ep, "GET", "/metrics", undefined, 60_000);
  return value(await parseMetrics((await readAll(res)).toString("utf8")), "forkd_peer_pulled_bytes_total");
}

step("the peer routes take the cluster's peer bearer only; it opens nothing of the API", async () => {
  const path = "/peer/v1/snapshots/nothing/manifest";
  for (const auth of [undefined, `Bearer ${ADMIN}`, `Bearer ${SECRET}`]) {
    const r = await peerGet(path, auth);
    assert.equal(r.status, 401, String(auth));
  }
  assert.equal((await peerGet(path, `Bearer ${PEER_BEARER}`)).status, 404);
  // The API on the same listener: the admin token works, the peer bearer does not.
  assert.equal(
    (await fetch(`${aUrl}/v1/snapshots`, { headers: { authorization: `Bearer ${ADMIN}` } })).status,
    200,
  );
  assert.equal(
    (await fetch(`${aUrl}/v1/snapshots`, { headers: { authorization: `Bearer ${PEER_BEARER}` } })).status,
    401,
  );
});

step(
  "a tenant's snapshot made on one node is pulled with its image to another, forked and run there",
  async () => {
    await api(a, "POST", "/v1/snapshots", {
      tag: "alice/pbase",
      memory_mib: 256,
      warm_eval: "pulled = 'yes'",
    });
    const r = await pull("alice/pbase", aUrl);
    assert.deepEqual(r.published, ["alice/pbase"]);
    assert.equal(r.tag, "alice/pbase");
    const paths = (r.bytes.files ?? []).map((f) => f.path);
    assert.ok(paths.includes("image/rootfs.ext4"), "the image travelled (an empty cache)");
    assert.ok(paths.includes("snapshots/alice~pbase/memory"));
    assert.equal((await metaOf(b, "alice/pbase")).owner, (await metaOf(a, "alice/pbase")).owner);
    assert.equal((await metaOf(b, "alice/pbase")).owner, "alice");
    const id = await forkOne(b, "alice/pbase");
    assert.equal(await sh(b, id, "echo hi from b"), "hi from b\n");
    const v = await api<{ value: string }>(b, "POST", `/v1/sandboxes/${id}/eval`, { code: "pulled" });
    assert.equal(v.value, "'yes'");
    await api(b, "DELETE", `/v1/sandboxes/${id}`);
  },
);

step("a branch made on the first node ships only its own files", async () => {
  const id = await forkOne(a, "alice/pbase");
  await sh(a, id, "echo one > /root/branch.txt");
  await api(a, "POST", `/v1/sandboxes/${id}/branch`, { tag: "pb1" });
  await api(a, "DELETE", `/v1/sandboxes/${id}`);
  // By the CLI this time: forkd pull --peer URL KEY.
  const out = await cli(b, ["pull", "--peer", aUrl, "pb1", "--json"]);
  assert.equal(out.code, 0, out.stderr);
  const r = JSON.parse(out.stdout) as Pulled;
  assert.deepEqual(r.published, ["pb1"]);
  const paths = (r.bytes.files ?? []).map((f) => f.path).sort();
  for (const p of paths) assert.match(p, /^snapshots\/(pb1\/|alice~pbase\/meta\.json$)/, p);
  const own = await ownBytes(a, "pb1", ["memory.diff", "vmstate", "disk.qcow2", "meta.json"]);
  const parentMeta = await ownBytes(a, "alice/pbase", ["meta.json"]);
  assert.equal(r.bytes.downloaded, own + parentMeta, "the branch's own files and its parent's metadata");
  const parentMemory = (await metaOf(a, "alice/pbase")).files.memory.size;
  assert.ok(r.bytes.downloaded < parentMemory / 4, `${r.bytes.downloaded} bytes, not the parent's memory`);
  assert.equal((await metaOf(b, "pb1")).owner ?? null, (await metaOf(a, "pb1")).owner ?? null);
  const child = await forkOne(b, "pb1");
  assert.equal(await sh(b, child, "cat /root/branch.txt"), "one\n");
  await api(b, "DELETE", `/v1/sandboxes/${child}`);
});

step("a pull cut mid-file resumes from the second holder with Range and succeeds", async () => {
  await api(b, "DELETE", "/v1/snapshots/alice%2Fpbase?cascade=1");
  const CUT = 64 << 20;
  const cut = await proxy({ kind: "cut", bytes: CUT });
  const second = await proxy();
  const before = await pulledBytes(b);
  const r = await pull("pb1", [cut.url, second.url]);
  assert.deepEqual(r.published, ["alice/pbase", "pb1"]);
  const memory = (await metaOf(a, "alice/pbase")).files.memory;
  // Asked of the second holder once, from the byte the cut left it at (what had crossed: up to CUT).
  const ranges = second.blobGets(memory.sha256).map((g) => g.range);
  assert.equal(ranges.length, 1, JSON.stringify(ranges));
  const from = Number(/^bytes=(\d+)-$/.exec(ranges[0] ?? "")?.[1]);
  assert.ok(from > CUT / 2 && from <= CUT, `resumed at ${from}`);
  assert.equal(
    r.bytes.files?.find((f) => f.path === "snapshots/alice~pbase/memory")?.bytes,
    memory.size,
    "each byte of the memory image once",
  );
  assert.equal((await pulledBytes(b)) - before, r.bytes.downloaded, "forkd_peer_pulled_bytes_total");
  const child = await forkOne(b, "pb1");
  assert.equal(await sh(b, child, "cat /root/branch.txt"), "one\n");
  await api(b, "DELETE", `/v1/sandboxes/${child}`);
});

step("two concurrent pulls of one key are one download", async () => {
  await api(b, "DELETE", "/v1/snapshots/alice%2Fpbase?cascade=1");
  const p = await proxy();
  const [one, two] = await Promise.all([pull("pb1", p.url), pull("pb1", p.url)]);
  assert.deepEqual(one.published, ["alice/pbase", "pb1"]);
  assert.deepEqual(two.published, one.published);
  assert.equal(two.bytes.downloaded, one.bytes.downloaded);
  // The image is here already: the chain's 8 files, each once; one manifest.
  assert.equal(p.blobGets().length, 8, JSON.stringify(p.requests));
  assert.equal(p.requests.filter((q) => q.path.endsWith("/manifest")).length, 1);
});
