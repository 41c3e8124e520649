/**
 * Push and pull through a real OCI registry (Debian's docker-registry on loopback), with real
 * VMs: a chain pushed from one daemon, a second child of the same base pushed without its base's
 * blobs, another repository filled by mounts, everything pulled into a daemon with an empty data
 * dir and image cache and forked there; pulls of pack files over http and https; and
 * registries that lie (a tampered blob, escaping paths, an oversized manifest, a foreign media
 * type) and a pack URL serving a decompression bomb refused with nothing left registered or
 * staged.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { copyFile, mkdtemp, readFile, readdir, rm, stat } from "node:fs/promises";
import { createReadStream } from "node:fs";
import { createServer as createHttp } from "node:http";
import { createServer as createHttps } from "node:https";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { api, forkOne, sh } from "../helpers/vm.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { startRegistry } from "../helpers/registry.js";
import { peakGrowth } from "../helpers/disk-usage.js";
import { forgePack } from "../helpers/forge-pack.js";
import type { TestRegistry } from "../helpers/registry.js";
import { steps } from "../helpers/steps.js";

const sh$ = promisify(execFile);
const { step, failed } = steps();
let a: TestDaemon;
let b: TestDaemon;
let reg: TestRegistry;
let work: string;
const servers: Server[] = [];

interface Pushed {
  ref: string;
  digest: string;
  blobs: { total: number; uploaded: number; mounted: number; skipped: number };
  bytes: { uploaded: number; skipped: number };
}
interface Pulled {
  tag: string;
  published: string[];
  digest: string | null;
  blobs: { total: number; downloaded: number; reused: number };
  bytes: { downloaded: number };
}

/** A chain of 4 snapshot files per tag plus the 4 image files. */
const FILES_PER_TAG = 4;
const IMAGE_FILES = 4;

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-registry-"));
  reg = await startRegistry(work);
  // A certificate for an https pack server, trusted by daemon b only (NODE_EXTRA_CA_CERTS).
  await sh$("openssl", [
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-days",
    "1",
    "-subj",
    "/CN=127.0.0.1",
    "-addext",
    "subjectAltName=IP:127.0.0.1",
    "-keyout",
    join(work, "key.pem"),
    "-out",
    join(work, "cert.pem"),
  ]);
  // Small chunks: every file above 8 MiB goes up in PATCH chunks.
  a = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_REGISTRY_CHUNK_MIB: "8" });
  b = await makeDaemon({
    FORKD_POOL_SIZE: "0",
    FORKD_CACHE_DIR: join(work, "cache-b"),
    NODE_EXTRA_CA_CERTS: join(work, "cert.pem"),
  });
});

after(async () => {
  for (const s of servers) s.close();
  await a.destroy(failed());
  await b.destroy(failed());
  await reg.stop();
  if (failed()) process.stderr.write(`registry test artefacts kept in ${work}\n`);
  else await rm(work, { recursive: true, force: true });
});

/** b's snapshots and leftovers: nothing may remain after a refused pull. */
async function bState(): Promise<{ tags: string[]; staging: string[] }> {
  const tags = (await api<{ snapshots: { tag: string }[] }>(b, "GET", "/v1/snapshots")).snapshots.map(
    (s) => s.tag,
  );
  const staging = (await readdir(join(b.dataDir, "snapshots"))).filter((n) => n.startsWith("."));
  return { tags: tags.sort(), staging };
}

/** path → blob digest of a manifest in the test registry (read straight from it). */
async function layersOf(repo: string, tag: string): Promise<Map<string, string>> {
  const res = await fetch(`http://${reg.host}/v2/${repo}/manifests/${tag}`, {
    headers: { accept: "application/vnd.oci.image.manifest.v1+json" },
  });
  const m = (await res.json()) as {
    artifactType: string;
    layers: { digest: string; annotations: Record<string, string> }[];
  };
  assert.equal(m.artifactType, "application/vnd.forkd.snapshot.v1");
  return new Map(m.layers.map((l) => [l.annotations["vnd.forkd.file.path"] ?? "", l.digest]));
}

/** What a push must report, given the blobs the repository already had (files in push order). */
function expectUploads(layers: Map<string, string>, had: Set<string>): { uploaded: number; skipped: number } {
  const seen = new Set(had);
  let uploaded = 0;
  for (const d of layers.values()) {
    if (!seen.has(d)) uploaded++;
    seen.add(d);
  }
  return { uploaded, skipped: layers.size - uploaded };
}

let r1Digest = "";
let r2Digest = "";

step("a chain is pushed; a second child of the same base uploads only its own blobs", async () => {
  await api(a, "POST", "/v1/snapshots", { tag: "rbase", memory_mib: 256, warm_eval: "pulled = 'yes'" });
  for (const [tag, text] of [
    ["r1", "one"],
    ["r2", "two"],
  ] as const) {
    const id = await forkOne(a, "rbase");
    await sh(a, id, `echo ${text} > /root/branch.txt`);
    await api(a, "POST", `/v1/sandboxes/${id}/branch`, { tag });
    await api(a, "DELETE", `/v1/sandboxes/${id}`);
  }
  const chainFiles = IMAGE_FILES + 2 * FILES_PER_TAG;

  const first = await cli(a, ["push", "r1", `${reg.host}/forkd/snaps:r1`, "--json"], 1_800_000);
  assert.equal(first.code, 0, first.stderr);
  // A branch's memory is its diff (format 3): no full image per branch.
  assert.match(first.stderr, /snapshots\/r1\/memory\.diff: uploaded/, "progress lines");
  assert.match(first.stderr, /snapshots\/rbase\/memory: uploaded/);
  assert.doesNotMatch(first.stderr, /snapshots\/r1\/memory: /);
  const p1 = JSON.parse(first.stdout) as Pushed;
  assert.match(p1.digest, /^sha256:[0-9a-f]{64}$/);
  r1Digest = p1.digest;
  const r1Layers = await layersOf("forkd/snaps", "r1");
  assert.equal(r1Layers.size, chainFiles);
  assert.deepEqual(p1.blobs, { total: chainFiles, mounted: 0, ...expectUploads(r1Layers, new Set()) });

  // The sibling shares the base and the image: those blobs are found in the registry.
  const p2 = await api<Pushed>(a, "POST", "/v1/snapshots/r2/push", { ref: `${reg.host}/forkd/snaps:r2` });
  r2Digest = p2.digest;
  const r2Layers = await layersOf("forkd/snaps", "r2");
  const shared = [...r1Layers.keys()].filter((p) => !p.startsWith("snapshots/r1/"));
  assert.equal(shared.length, IMAGE_FILES + FILES_PER_TAG);
  for (const p of shared) assert.equal(r2Layers.get(p), r1Layers.get(p), `${p}: one blob for both`);
  const want = expectUploads(r2Layers, new Set(r1Layers.values()));
  assert.deepEqual(p2.blobs, { total: chainFiles, mounted: 0, ...want });
  assert.ok(want.skipped >= shared.length && want.uploaded >= 2, "base and image skipped, r2's own sent");
  assert.ok(p2.bytes.skipped > p2.bytes.uploaded, "the base and the image are most of the bytes");

  // Another repository of the same registry: every blob is mounted, none uploaded.
  const p3 = await api<Pushed>(a, "POST", "/v1/snapshots/r2/push", { ref: `${reg.host}/forkd/other:r2` });
  assert.equal(p3.blobs.uploaded, 0);
  assert.equal(p3.blobs.mounted + p3.blobs.skipped, chainFiles);
  assert.equal(p3.blobs.mounted, new Set(r2Layers.values()).size, "each distinct blob mounted once");
  assert.equal(p3.bytes.uploaded, 0);

  // Pushing again what is there: HEADs only (blob digests are cached: nothing is recompressed).
  const again = await cli(a, ["push", "r1", `${reg.host}/forkd/snaps:r1`]);
  assert.equal(again.code, 0, again.stderr);
  assert.match(
    again.stdout,
    new RegExp(`: 0 of ${chainFiles} blobs uploaded \\(0\\.0 MiB\\), ${chainFiles} already`),
  );
});

step("pulled into an empty data dir and image cache, the chain forks with its state", async () => {
  const r = await cli(b, ["pull", `${reg.host}/forkd/snaps:r1`], 1_800_000);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /r1 ready \(registered: rbase, r1;/);
  const info = await api<{ depth: number; ancestors: string[] }>(b, "GET", "/v1/snapshots/r1/info");
  assert.deepEqual([info.depth, info.ancestors], [1, ["rbase"]]);
  const id = await forkOne(b, "r1");
  assert.equal(await sh(b, id, "cat /root/branch.txt"), "one\n");
  const v = await api<{ value: string }>(b, "POST", `/v1/sandboxes/${id}/eval`, { code: "pulled" });
  assert.equal(v.value, "'yes'");
  await api(b, "DELETE", `/v1/sandboxes/${id}`);

  // The sibling, by digest: the base and the image are here, so they are not downloaded.
  const p = await cli(b, ["pull", `${reg.host}/forkd/snaps@${r2Digest}`], 1_800_000);
  assert.equal(p.code, 0, p.stderr);
  assert.match(p.stdout, /r2 ready \(registered: r2;/);
  const how = new Map(
    [...p.stderr.matchAll(/\] \[\d+\/\d+\] (\S+): (here already|downloaded)/g)].map((m) => [
      m[1] ?? "",
      m[2] ?? "",
    ]),
  );
  assert.equal(how.size, IMAGE_FILES + 2 * FILES_PER_TAG, p.stderr);
  for (const [path, got] of how) {
    if (path.startsWith("image/") || /^snapshots\/rbase\/(memory|vmstate|disk\.qcow2)$/.test(path)) {
      assert.equal(got, "here already", path);
    }
    if (/^snapshots\/(r2\/(disk\.qcow2|meta\.json)|rbase\/meta\.json)$/.test(path)) {
      assert.equal(got, "downloaded", path);
    }
  }
  const id2 = await forkOne(b, "r2");
  assert.equal(await sh(b, id2, "cat /root/branch.txt"), "two\n");
  await api(b, "DELETE", `/v1/sandboxes/${id2}`);

  // Again under another tag, from the mounted repository: r2's memory diff here is linked, not
  // fetched; the disk layer is fetched (registration rebases it in place).
  const again = await api<Pulled>(b, "POST", "/v1/snapshots/pull", {
    ref: `${reg.host}/forkd/other:r2`,
    tag: "r2-copy",
  });
  assert.deepEqual(again.published, ["r2-copy"]);
  assert.equal(again.blobs.downloaded + again.blobs.reused, again.blobs.total);
  assert.ok(again.blobs.reused >= IMAGE_FILES + 3 + 1, JSON.stringify(again.blobs));
  const copyInfo = await api<{ ancestors: string[] }>(b, "GET", "/v1/snapshots/r2-copy/info");
  assert.deepEqual(copyInfo.ancestors, ["rbase"]);
  const id3 = await forkOne(b, "r2-copy");
  assert.equal(await sh(b, id3, "cat /root/branch.txt"), "two\n");
  await api(b, "DELETE", `/v1/sandboxes/${id3}`);
});

/** Serves `file` at /FILE over http or https (with the test certificate) on loopback. */
async function servePack(file: string, tls: boolean): Promise<string> {
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    if (req.url !== "/snap.forkd.tar.zst") return void res.writeHead(404).end();
    void stat(file).then((st) => {
      res.writeHead(200, { "content-length": st.size, "content-type": "application/zstd" });
      createReadStream(file).pipe(res);
    });
  };
  const server = tls
    ? createHttps(
        { key: await readFile(join(work, "key.pem")), cert: await readFile(join(work, "cert.pem")) },
        handler,
      )
    : createHttp(handler);
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const port = (server.address() as { port: number }).port;
  return `${tls ? "https" : "http"}://127.0.0.1:${port}/snap.forkd.tar.zst`;
}

step(
  "a pack file is pulled from an http URL on loopback and an https URL with a trusted certificate",
  async () => {
    const pack = join(work, "r1.forkd.tar.zst");
    const packed = await cli(a, ["pack", "r1", "-o", pack]);
    assert.equal(packed.code, 0, packed.stderr);
    const httpUrl = await servePack(pack, false);
    const httpsUrl = await servePack(pack, true);

    const viaHttp = await api<Pulled>(b, "POST", "/v1/snapshots/pull", { url: httpUrl, tag: "r1-http" });
    assert.deepEqual(viaHttp.published, ["r1-http"]);
    assert.equal(viaHttp.bytes.downloaded, (await stat(pack)).size);
    const viaHttps = await cli(b, ["pull", httpsUrl, "--tag", "r1-https"], 1_800_000);
    assert.equal(viaHttps.code, 0, viaHttps.stderr);
    assert.match(viaHttps.stdout, /r1-https ready \(registered: r1-https;/);
    const id = await forkOne(b, "r1-https");
    assert.equal(await sh(b, id, "cat /root/branch.txt"), "one\n");
    await api(b, "DELETE", `/v1/sandboxes/${id}`);

    // Daemon a does not trust the certificate; plain http elsewhere than loopback is refused.
    await assert.rejects(api(a, "POST", "/v1/snapshots/pull", { url: httpsUrl, tag: "x1" }), /certificate/i);
    await assert.rejects(
      api(a, "POST", "/v1/snapshots/pull", { url: "http://forkd-test.invalid/x.tar.zst" }),
      /only https, or http on loopback/,
    );
  },
);

/** A registry that serves crafted manifests and records whether any blob was asked for. */
async function lyingRegistry(
  manifests: Record<string, Buffer>,
): Promise<{ host: string; blobAsks: () => number }> {
  let asks = 0;
  const server = createHttp((req, res) => {
    const url = req.url ?? "/";
    if (url === "/v2/") return void res.writeHead(200).end("{}");
    const m = /^\/v2\/evil\/snap\/manifests\/([\w.-]+)$/.exec(url);
    const body = m ? manifests[m[1] ?? ""] : undefined;
    if (body) {
      res.writeHead(200, { "content-type": "application/vnd.oci.image.manifest.v1+json" });
      return void res.end(body);
    }
    if (url.includes("/blobs/")) asks++;
    res.writeHead(404).end();
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return { host: `127.0.0.1:${(server.address() as { port: number }).port}`, blobAsks: () => asks };
}

step(
  "a tampered blob, escaping paths, an oversized manifest and a foreign type are refused; nothing is left",
  async () => {
    for (const t of ["r2-copy", "r1-http", "r1-https"]) await api(b, "DELETE", `/v1/snapshots/${t}`);
    const before = await bState();
    const real = Buffer.from(
      await (
        await fetch(`http://${reg.host}/v2/forkd/snaps/manifests/r1`, {
          headers: { accept: "application/vnd.oci.image.manifest.v1+json" },
        })
      ).arrayBuffer(),
    );
    const manifest = () =>
      JSON.parse(real.toString()) as {
        artifactType: string;
        annotations: Record<string, string>;
        layers: { digest: string; annotations: Record<string, string> }[];
      };

    // The registry's copy of r1's disk layer, one byte changed: the pull (under a new tag, so the
    // layer is needed) fails on the digest.
    const disk = manifest().layers.find(
      (l) => l.annotations["vnd.forkd.file.path"] === "snapshots/r1/disk.qcow2",
    );
    assert.ok(disk);
    const blobFile = reg.blobPath(disk.digest);
    await copyFile(blobFile, join(work, "blob.orig"));
    const { stdout } = await sh$("sh", [
      "-c",
      `printf 'X' | dd of=${blobFile} bs=1 seek=200 conv=notrunc 2>/dev/null; echo ok`,
    ]);
    assert.equal(stdout.trim(), "ok");
    await assert.rejects(
      api(b, "POST", "/v1/snapshots/pull", { ref: `${reg.host}/forkd/snaps@${r1Digest}`, tag: "tampered" }),
      /does not match its digest/,
    );
    assert.deepEqual(await bState(), before, "tampered: nothing left behind");
    await copyFile(join(work, "blob.orig"), blobFile);

    const escaping = manifest();
    const l0 = escaping.layers[0];
    assert.ok(l0);
    l0.annotations["vnd.forkd.file.path"] = "../../../../etc/cron.d/forkd";
    const foreign = { ...manifest(), artifactType: "application/vnd.example.other.v1" };
    const huge = manifest();
    huge.annotations.padding = "x".repeat(5 << 20);
    const liar = await lyingRegistry({
      escaping: Buffer.from(JSON.stringify(escaping)),
      foreign: Buffer.from(JSON.stringify(foreign)),
      huge: Buffer.from(JSON.stringify(huge)),
    });
    const cases: Array<[string, RegExp]> = [
      ["escaping", /layer path "..\/..\/..\/..\/etc\/cron.d\/forkd"/],
      ["foreign", /not a forkd snapshot artifact: artifactType/],
      ["huge", /larger than 4194304 bytes/],
    ];
    for (const [tag, want] of cases) {
      const r = await cli(b, ["pull", `${liar.host}/evil/snap:${tag}`, "--tag", `evil-${tag}`]);
      assert.notEqual(r.code, 0, `${tag}: refused`);
      assert.match(r.stderr, want, `${tag}: ${r.stderr}`);
      assert.deepEqual(await bState(), before, `${tag}: nothing left behind`);
    }
    assert.equal(liar.blobAsks(), 0, "refused before any blob was asked for");
    await assert.rejects(stat("/etc/cron.d/forkd"), "nothing was written outside");
  },
);

step(
  "a pack URL serving a tiny archive that expands to gigabytes is refused before it writes them",
  async () => {
    const before = await bState();
    const { stdout } = await sh$(
      "tar",
      ["--zstd", "-xOf", join(work, "r1.forkd.tar.zst"), "./manifest.json"],
      {
        maxBuffer: 1 << 26,
      },
    );
    const raw = Buffer.from(stdout);
    const big = 2 ** 31;
    const bomb = await forgePack(join(work, "bomb.tar.zst"), [
      ["manifest.json", raw.length, raw],
      ["snapshots/rbase/memory", big, 0x41],
    ]);
    assert.ok((await stat(bomb)).size < 1 << 20, "a small archive");
    const url = await servePack(bomb, false);
    const { result, grownKiB } = await peakGrowth([b.dataDir, join(work, "cache-b")], () =>
      api(b, "POST", "/v1/snapshots/pull", { url, tag: "bomb" }),
    );
    assert.ok(grownKiB < 16 << 10, `at most 16 MiB written, not ${grownKiB} KiB`);
    assert.equal(result.status, "rejected");
    assert.match(
      String(result.status === "rejected" ? result.reason : ""),
      new RegExp(`memory is ${big} bytes`),
    );
    assert.deepEqual(await bState(), before, "nothing left behind");
  },
);
