/**
 * Test images, built in-process and pushed as OCI (or Docker schema 2) to a registry (the
 * loopback one of registry.ts): a tar writer for layers (every entry type, pax long names and
 * xattrs), pushImage() for manifests, indexes and manifest lists with gzip, zstd or plain
 * layers, and ready-made images: a static busybox tree, a multi-layer image exercising every
 * flatten rule (MULTI_LAYER_EXPECT says what its tree must hold), a Debian tree from the python
 * template's debootstrap tarball, and hostile images.
 */
import { execFileSync, spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, readFileSync } from "node:fs";
import { mkdir, rename, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Readable } from "node:stream";
import { gzipSync } from "node:zlib";
import { clientFor } from "../../src/registry/client.js";
import type { RegistryClient } from "../../src/registry/client.js";
import { parseRef } from "../../src/registry/ref.js";

// ---------------------------------------------------------------- tar

export interface TarSpec {
  name: string;
  type?: "file" | "dir" | "symlink" | "hardlink" | "char" | "block" | "fifo";
  data?: Buffer | string;
  mode?: number;
  uid?: number;
  gid?: number;
  /** Seconds since the epoch (default 1700000000). */
  mtime?: number;
  linkname?: string;
  xattrs?: Record<string, Buffer | string>;
  devmajor?: number;
  devminor?: number;
}

const TYPEFLAG = {
  file: "0",
  hardlink: "1",
  symlink: "2",
  char: "3",
  block: "4",
  dir: "5",
  fifo: "6",
} as const;
export const DEFAULT_MTIME = 1_700_000_000;

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, "0") + "\0";
}

function header(
  name: string,
  type: string,
  o: {
    size: number;
    mode: number;
    uid: number;
    gid: number;
    mtime: number;
    linkname: string;
    devmajor?: number;
    devminor?: number;
  },
): Buffer {
  const h = Buffer.alloc(512);
  h.write(name.slice(0, 100), 0, "utf8");
  h.write(octal(o.mode, 8), 100, "latin1");
  h.write(octal(o.uid, 8), 108, "latin1");
  h.write(octal(o.gid, 8), 116, "latin1");
  h.write(octal(o.size, 12), 124, "latin1");
  h.write(octal(o.mtime, 12), 136, "latin1");
  h.write("        ", 148, "latin1");
  h.write(type, 156, "latin1");
  h.write(o.linkname.slice(0, 100), 157, "utf8");
  h.write("ustar\0", 257, "latin1");
  h.write("00", 263, "latin1");
  h.write(octal(o.devmajor ?? 0, 8), 329, "latin1");
  h.write(octal(o.devminor ?? 0, 8), 337, "latin1");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7) + " ", 148, "latin1");
  return h;
}

function paxRecord(key: string, value: Buffer): Buffer {
  const body = Buffer.concat([Buffer.from(` ${key}=`), value, Buffer.from("\n")]);
  let len = body.length + 1;
  while (String(len).length + body.length !== len) len = String(len).length + body.length;
  return Buffer.concat([Buffer.from(String(len)), body]);
}

const pad = (n: number) => Buffer.alloc((512 - (n % 512)) % 512);

/** A tar of `entries` (ustar; pax headers for long names, long link names and xattrs). */
export function makeTar(entries: TarSpec[]): Buffer {
  const out: Buffer[] = [];
  for (const e of entries) {
    const type = e.type ?? "file";
    const data = type === "file" ? Buffer.from(e.data ?? "") : Buffer.alloc(0);
    const linkname = e.linkname ?? "";
    const records: Buffer[] = [];
    if (Buffer.byteLength(e.name) > 100) records.push(paxRecord("path", Buffer.from(e.name)));
    if (Buffer.byteLength(linkname) > 100) records.push(paxRecord("linkpath", Buffer.from(linkname)));
    for (const [k, v] of Object.entries(e.xattrs ?? {}))
      records.push(paxRecord(`SCHILY.xattr.${k}`, Buffer.from(v)));
    const meta = { uid: e.uid ?? 0, gid: e.gid ?? 0, mtime: e.mtime ?? DEFAULT_MTIME };
    if (records.length > 0) {
      const body = Buffer.concat(records);
      out.push(
        header("PaxHeaders/x", "x", { ...meta, size: body.length, mode: 0o644, linkname: "" }),
        body,
        pad(body.length),
      );
    }
    const mode = e.mode ?? (type === "dir" ? 0o755 : type === "symlink" ? 0o777 : 0o644);
    out.push(
      header(e.name, TYPEFLAG[type], {
        ...meta,
        size: data.length,
        mode,
        linkname,
        ...(e.devmajor !== undefined ? { devmajor: e.devmajor } : {}),
        ...(e.devminor !== undefined ? { devminor: e.devminor } : {}),
      }),
      data,
      pad(data.length),
    );
  }
  out.push(Buffer.alloc(1024));
  return Buffer.concat(out);
}

// ---------------------------------------------------------------- compression

export type TestCompression = "gzip" | "zstd" | "none";

function zstd(args: string[], input: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const z = spawn("zstd", [...args, "-q", "-c"], { stdio: ["pipe", "pipe", "inherit"] });
    const parts: Buffer[] = [];
    z.stdout.on("data", (b: Buffer) => parts.push(b));
    z.on("error", reject);
    z.on("exit", (code) =>
      code === 0 ? resolve(Buffer.concat(parts)) : reject(new Error(`zstd exit ${code}`)),
    );
    z.stdin.end(input);
  });
}

export async function compress(tar: Buffer, c: TestCompression): Promise<Buffer> {
  if (c === "gzip") return gzipSync(tar);
  if (c === "zstd") return zstd(["-3"], tar);
  return tar;
}

export const sha256 = (b: Buffer): string => `sha256:${createHash("sha256").update(b).digest("hex")}`;

// ---------------------------------------------------------------- push

/** A layer: a tar in memory, or a compressed file on disk with its diff_id known. */
export type LayerInput =
  | { tar: Buffer; compression?: TestCompression }
  | { file: string; compression: TestCompression; diffId: string };

export interface PushOptions {
  /** "oci" (default) or "docker" (schema 2 media types; an index becomes a manifest list). */
  format?: "oci" | "docker";
  /** Wrap the manifest in an index / manifest list, beside an arm64 decoy. */
  index?: boolean;
  /** The config's `config` object (Env, WorkingDir, User, Entrypoint, Cmd, Labels, …). */
  config?: Record<string, unknown>;
  /** Replace the config's diff_ids (to make a lying config). */
  diffIds?: string[];
  architecture?: string;
}

export interface PushedImage {
  /** host/repo:tag */
  ref: string;
  /** The platform (linux/amd64) manifest's digest: what PulledImage.digest is. */
  digest: string;
  /** The index's digest when one was pushed. */
  indexDigest: string | null;
  /** host/repo@<the top digest> */
  refByDigest: string;
  layers: { digest: string; diffId: string; size: number; mediaType: string }[];
  configDigest: string;
}

const MEDIA = {
  oci: {
    manifest: "application/vnd.oci.image.manifest.v1+json",
    index: "application/vnd.oci.image.index.v1+json",
    config: "application/vnd.oci.image.config.v1+json",
    layer: {
      gzip: "application/vnd.oci.image.layer.v1.tar+gzip",
      zstd: "application/vnd.oci.image.layer.v1.tar+zstd",
      none: "application/vnd.oci.image.layer.v1.tar",
    },
  },
  docker: {
    manifest: "application/vnd.docker.distribution.manifest.v2+json",
    index: "application/vnd.docker.distribution.manifest.list.v2+json",
    config: "application/vnd.docker.container.image.v1+json",
    layer: {
      gzip: "application/vnd.docker.image.rootfs.diff.tar.gzip",
      zstd: "application/vnd.docker.image.rootfs.diff.tar.zstd",
      none: "application/vnd.docker.image.rootfs.diff.tar",
    },
  },
} as const;

/** A push client for `host/repo` (plain http: the test registry is on loopback). */
export function pushClient(host: string, repo: string): RegistryClient {
  return clientFor(
    parseRef(`${host}/${repo}`),
    { credentials: () => Promise.resolve(null), insecureHosts: [], chunkBytes: 64 << 20, idleMs: 60_000 },
    { insecure: false, push: true },
  );
}

async function putBlob(
  c: RegistryClient,
  data: Buffer | { file: string; size: number },
  digest: string,
): Promise<void> {
  if (await c.blobExists(digest)) return;
  if (Buffer.isBuffer(data)) {
    await c.uploadBlob(digest, data.length, (s, e) => Readable.from([data.subarray(s, e)]));
  } else {
    await c.uploadBlob(digest, data.size, (s, e) => createReadStream(data.file, { start: s, end: e - 1 }));
  }
}

/** Pushes an image made of `layers` as `host/repo:tag`. */
export async function pushImage(
  host: string,
  repo: string,
  tag: string,
  layers: LayerInput[],
  o: PushOptions = {},
): Promise<PushedImage> {
  const fmt = MEDIA[o.format ?? "oci"];
  const c = pushClient(host, repo);
  const descs: PushedImage["layers"] = [];
  for (const l of layers) {
    if ("tar" in l) {
      const comp = l.compression ?? "gzip";
      const blob = await compress(l.tar, comp);
      const digest = sha256(blob);
      await putBlob(c, blob, digest);
      descs.push({ digest, diffId: sha256(l.tar), size: blob.length, mediaType: fmt.layer[comp] });
    } else {
      const size = (await stat(l.file)).size;
      const digest = await fileDigest(l.file);
      await putBlob(c, { file: l.file, size }, digest);
      descs.push({ digest, diffId: l.diffId, size, mediaType: fmt.layer[l.compression] });
    }
  }
  const config = Buffer.from(
    JSON.stringify({
      architecture: o.architecture ?? "amd64",
      os: "linux",
      config: o.config ?? {},
      rootfs: { type: "layers", diff_ids: o.diffIds ?? descs.map((d) => d.diffId) },
      history: descs.map(() => ({ created_by: "forkd test" })),
    }),
  );
  const configDigest = sha256(config);
  await putBlob(c, config, configDigest);
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: fmt.manifest,
      config: { mediaType: fmt.config, digest: configDigest, size: config.length },
      layers: descs.map((d) => ({ mediaType: d.mediaType, digest: d.digest, size: d.size })),
    }),
  );
  const digest = sha256(manifest);
  let indexDigest: string | null = null;
  if (o.index) {
    await c.putManifest(digest, fmt.manifest, manifest);
    // A decoy for another platform first: the puller must pick linux/amd64.
    const decoyConfig = Buffer.from(
      JSON.stringify({
        architecture: "arm64",
        os: "linux",
        config: {},
        rootfs: { type: "layers", diff_ids: [] },
      }),
    );
    await putBlob(c, decoyConfig, sha256(decoyConfig));
    const decoy = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: fmt.manifest,
        config: { mediaType: fmt.config, digest: sha256(decoyConfig), size: decoyConfig.length },
        layers: [],
      }),
    );
    await c.putManifest(sha256(decoy), fmt.manifest, decoy);
    const index = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: fmt.index,
        manifests: [
          {
            mediaType: fmt.manifest,
            digest: sha256(decoy),
            size: decoy.length,
            platform: { architecture: "arm64", os: "linux", variant: "v8" },
          },
          {
            mediaType: fmt.manifest,
            digest,
            size: manifest.length,
            platform: { architecture: "amd64", os: "linux" },
          },
        ],
      }),
    );
    indexDigest = await c.putManifest(tag, fmt.index, index);
  } else {
    await c.putManifest(tag, fmt.manifest, manifest);
  }
  return {
    ref: `${host}/${repo}:${tag}`,
    digest,
    indexDigest,
    refByDigest: `${host}/${repo}@${indexDigest ?? digest}`,
    layers: descs,
    configDigest,
  };
}

async function fileDigest(path: string): Promise<string> {
  const h = createHash("sha256");
  for await (const c of createReadStream(path) as AsyncIterable<Buffer>) h.update(c);
  return `sha256:${h.digest("hex")}`;
}

/**
 * Overwrites a blob in the registry's storage with as many other bytes (registry.ts blobPath):
 * the registry serves it as it is, so a pull gets content that does not match its digest.
 */
export async function corruptBlob(blobPath: string): Promise<void> {
  const size = (await stat(blobPath)).size;
  await writeFile(blobPath, randomBytes(size));
}

// ---------------------------------------------------------------- ready-made images

const dir = (name: string, mode = 0o755): TarSpec => ({ name, type: "dir", mode });

/** A static busybox root: /bin/busybox (the host's static build), its applets as symlinks. */
export function busyboxTar(busybox = "/bin/busybox"): Buffer {
  const applets = spawnSyncList(busybox);
  const dirs = new Set<string>([
    "bin",
    "sbin",
    "usr",
    "usr/bin",
    "usr/sbin",
    "etc",
    "root",
    "tmp",
    "proc",
    "sys",
    "dev",
  ]);
  const entries: TarSpec[] = [...dirs].map((d) =>
    dir(d, d === "tmp" ? 0o1777 : d === "root" ? 0o700 : 0o755),
  );
  entries.push({ name: "bin/busybox", data: readFileSync(busybox), mode: 0o755 });
  for (const a of applets) {
    if (a === "bin/busybox") continue;
    entries.push({ name: a, type: "symlink", linkname: "/bin/busybox" });
  }
  entries.push({
    name: "etc/passwd",
    data: "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
  });
  entries.push({ name: "etc/group", data: "root:x:0:\nnogroup:x:65534:\n" });
  return makeTar(entries);
}

function spawnSyncList(busybox: string): string[] {
  // `busybox --list-full`: bin/sh, usr/bin/[, sbin/acpid, …
  const out = execFileSync(busybox, ["--list-full"], { encoding: "utf8" });
  return out.split("\n").filter((l) => l.length > 0 && !l.includes(".."));
}

/** security.capability for cap_net_raw+ep (VFS_CAP_REVISION_2), as setcap writes it. */
export const CAP_NET_RAW = Buffer.from("0000000220000000000000000000000000000000", "hex");

/**
 * The multi-layer image's layers: whiteouts, an opaque directory, hard links (also across
 * layers), a symlink, a setuid file, owners, mtimes, xattrs, a file replaced by a directory and
 * a directory replaced by a file.
 */
export function multiLayerTars(): Buffer[] {
  const l1 = makeTar([
    dir("etc"),
    { name: "etc/keep.txt", data: "layer1\n" },
    { name: "etc/gone.txt", data: "whited out\n" },
    dir("opt"),
    dir("opt/old"),
    { name: "opt/old/a.txt", data: "a\n" },
    dir("opt/old/sub"),
    { name: "opt/old/sub/deep.txt", data: "deep\n" },
    dir("data"),
    { name: "data/x.txt", data: "shared inode\n", uid: 1000, gid: 1000, mode: 0o640, mtime: 1_600_000_000 },
    dir("gonedir"),
    { name: "gonedir/inner.txt", data: "gone with its dir\n" },
    { name: "becomes-dir", data: "a file first\n" },
    dir("becomes-file"),
    { name: "becomes-file/child", data: "x\n" },
  ]);
  const l2 = makeTar([
    dir("etc"),
    { name: "etc/.wh.gone.txt" },
    { name: "etc/keep.txt", data: "layer2\n" },
    dir("opt/old"),
    { name: "opt/old/.wh..wh..opq" },
    { name: "opt/old/b.txt", data: "b\n" },
    { name: "data/x-link", type: "hardlink", linkname: "data/x.txt" },
    { name: "data/sym", type: "symlink", linkname: "x.txt" },
    { name: ".wh.gonedir" },
    dir("usr"),
    dir("usr/bin"),
    { name: "usr/bin/suid", data: "#!/bin/sh\n", mode: 0o4755 },
    { name: "usr/bin/sgid", data: "#!/bin/sh\n", mode: 0o2755, gid: 50 },
    { name: "usr/bin/cap", data: "#!/bin/sh\n", mode: 0o755, xattrs: { "security.capability": CAP_NET_RAW } },
    { name: "usr/bin/tagged", data: "x\n", xattrs: { "user.forkd.test": "hello" } },
    dir("becomes-dir"),
    { name: "becomes-dir/now", data: "a dir now\n" },
    { name: "becomes-file", data: "a file now\n" },
    dir("home"),
    dir("home/user", 0o750),
    { name: `home/user/${"long-name-".repeat(12)}.txt`, data: "long\n", uid: 1000, gid: 1000 },
    { name: "pipe", type: "fifo", mode: 0o600 },
  ]);
  const l3 = makeTar([
    // A hard link to a file of a lower layer, and an opaque dir's newcomer kept.
    { name: "data/x-link2", type: "hardlink", linkname: "data/x.txt" },
    dir("home/user", 0o750),
  ]);
  // Directory entries carry their mode and owner, applied once every layer is in.
  return [l1, l2, l3];
}

/** What the multi-layer image's tree holds (relative paths; absent: must not exist). */
export const MULTI_LAYER_EXPECT = {
  files: {
    "etc/keep.txt": "layer2\n",
    "opt/old/b.txt": "b\n",
    "data/x.txt": "shared inode\n",
    "becomes-dir/now": "a dir now\n",
    "becomes-file": "a file now\n",
  } as Record<string, string>,
  absent: ["etc/gone.txt", "opt/old/a.txt", "opt/old/sub", "gonedir", "becomes-file/child"],
  /** Paths that are one inode. */
  hardlinks: [["data/x.txt", "data/x-link", "data/x-link2"]],
  symlinks: { "data/sym": "x.txt" } as Record<string, string>,
  modes: {
    "usr/bin/suid": 0o4755,
    "usr/bin/sgid": 0o2755,
    "data/x.txt": 0o640,
    "home/user": 0o750,
    pipe: 0o600,
  } as Record<string, number>,
  owners: { "data/x.txt": [1000, 1000], "usr/bin/sgid": [0, 50] } as Record<string, [number, number]>,
  mtimes: { "data/x.txt": 1_600_000_000, "etc/keep.txt": DEFAULT_MTIME } as Record<string, number>,
  xattrs: {
    "usr/bin/cap": ["security.capability", CAP_NET_RAW],
    "usr/bin/tagged": ["user.forkd.test", Buffer.from("hello")],
  } as Record<string, [string, Buffer]>,
  fifos: ["pipe"],
  longName: `home/user/${"long-name-".repeat(12)}.txt`,
};

/** The config the ready-made images carry (what PulledImage.config must say). */
export const TEST_CONFIG = {
  Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "FORKD_TEST=1"],
  WorkingDir: "/root",
  User: "root",
  Cmd: ["sh"],
  Labels: { "org.forkd.test": "yes" },
};

/**
 * Hostile layer sets, each refused by a flatten: `entry` is what the error must name, `why` what
 * it must say (each would get past the other checks: a test that only one check stops).
 */
export function hostileTars(): Record<string, { layers: Buffer[]; entry: string; why: RegExp }> {
  const dotdot = /a "\.\." component would leave the image's root/;
  const passwd = { name: "etc/passwd", data: "root:x:0:0::/root:/bin/sh\n" };
  return {
    dotdot: {
      layers: [makeTar([{ name: "../escape.txt", data: "out\n" }])],
      entry: "../escape.txt",
      why: dotdot,
    },
    "dotdot-inner": {
      layers: [makeTar([dir("a"), { name: "a/../../escape.txt", data: "out\n" }])],
      entry: "a/../../escape.txt",
      why: dotdot,
    },
    "symlink-parent": {
      layers: [
        makeTar([
          { name: "evil", type: "symlink", linkname: "/tmp" },
          { name: "evil/pwned", data: "x\n" },
        ]),
      ],
      entry: "evil/pwned",
      why: /its parent \/evil is a symlink/,
    },
    "symlink-parent-across-layers": {
      layers: [
        makeTar([{ name: "evil", type: "symlink", linkname: "../../../../tmp" }]),
        makeTar([{ name: "evil/pwned", data: "x\n" }]),
      ],
      entry: "evil/pwned",
      why: /its parent \/evil is a symlink/,
    },
    "symlink-replaces-dir": {
      // A directory a lower layer made (and entries went into) becomes a symlink, then is written through.
      layers: [
        makeTar([dir("d"), { name: "d/f", data: "x\n" }]),
        makeTar([{ name: "d", type: "symlink", linkname: "/tmp" }]),
        makeTar([{ name: "d/pwned", data: "x\n" }]),
      ],
      entry: "d/pwned",
      why: /its parent \/d is a symlink/,
    },
    // A whiteout or an opaque marker under a symlink would remove files outside the root. The
    // symlinks point where nothing is, so a flatten without the check harms nothing (and fails
    // the test by not refusing).
    "whiteout-through-symlink": {
      layers: [
        makeTar([{ name: "evil", type: "symlink", linkname: "/nonexistent-forkd-test/etc" }]),
        makeTar([{ name: "evil/.wh.passwd" }]),
      ],
      entry: "evil/.wh.passwd",
      why: /its parent \/evil is a symlink/,
    },
    "opaque-through-symlink": {
      layers: [
        makeTar([{ name: "evil", type: "symlink", linkname: "/nonexistent-forkd-test/etc" }]),
        makeTar([{ name: "evil/.wh..wh..opq" }]),
      ],
      entry: "evil/.wh..wh..opq",
      why: /its parent \/evil is a symlink/,
    },
    "absolute-hardlink": {
      layers: [makeTar([dir("etc"), passwd, { name: "h", type: "hardlink", linkname: "/etc/passwd" }])],
      entry: "h",
      why: /hard link to an absolute path "\/etc\/passwd"/,
    },
    "hardlink-outside": {
      layers: [makeTar([dir("etc"), passwd, { name: "h", type: "hardlink", linkname: "../etc/passwd" }])],
      entry: "h",
      why: dotdot,
    },
    "hardlink-through-symlink": {
      layers: [
        makeTar([
          { name: "s", type: "symlink", linkname: "/etc" },
          { name: "h", type: "hardlink", linkname: "s/passwd" },
        ]),
      ],
      entry: "h",
      why: /hard link through a symlink \(\/s\)/,
    },
    // Device nodes are skipped, not made (deviceTars); one is still checked like any entry first.
    "device-dotdot": {
      layers: [makeTar([{ name: "../null", type: "char", devmajor: 1, devminor: 3, mode: 0o666 }])],
      entry: "../null",
      why: dotdot,
    },
    "device-through-symlink": {
      layers: [
        makeTar([
          { name: "evil", type: "symlink", linkname: "/nonexistent-forkd-test/dev" },
          { name: "evil/sda0", type: "block", devmajor: 8, devminor: 0, mode: 0o600 },
        ]),
      ],
      entry: "evil/sda0",
      why: /its parent \/evil is a symlink/,
    },
    "hardlink-to-whited-out-device": {
      // A skipped node a later layer whited out is gone: a hard link to it links to nothing.
      layers: [
        makeTar([dir("dev"), { name: "dev/null", type: "char", devmajor: 1, devminor: 3, mode: 0o666 }]),
        makeTar([{ name: "dev/.wh.null" }, { name: "h", type: "hardlink", linkname: "dev/null" }]),
      ],
      entry: "h",
      why: /hard link to \/dev\/null, which does not exist/,
    },
  };
}

// ---------------------------------------------------------------- the Debian tree

/**
 * The python template's debootstrap tarball (`<cache>/stages/rootfs-base-<hash>/rootfs-base.tar.zst`:
 * python3 with numpy), as guest/image/build.sh --base-only finds it, or makes it when it is not
 * cached (a cache collection may have removed it while keeping the images made from it).
 */
export async function debootstrapTarball(cache = "/var/cache/forkd", template = "python"): Promise<string> {
  const script = fileURLToPath(new URL("../../../guest/image/build.sh", import.meta.url));
  const dir = await new Promise<string>((resolve, reject) => {
    const p = spawn("bash", [script, "--template", template, "--cache", cache, "--base-only", "--no-agent"], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    p.stdout.on("data", (b: Buffer) => (out += b.toString()));
    p.stderr.on("data", (b: Buffer) => (err = (err + b.toString()).slice(-4000)));
    p.on("error", reject);
    p.on("exit", (code) =>
      code === 0 ? resolve(out.trim()) : reject(new Error(`build.sh --base-only exit ${code}: ${err}`)),
    );
  });
  const file = join(dir, "rootfs-base.tar.zst");
  await stat(file);
  return file;
}

function sh(cmd: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { stdio: ["ignore", "ignore", "inherit"] });
    p.on("error", reject);
    p.on("exit", (code) => (code === 0 ? resolve() : reject(new Error(`${cmd} exit ${code}`))));
  });
}

/**
 * The debootstrap tree as an image layer, zstd-compressed, with its diff_id. By default its /dev
 * device nodes are removed (recompressed); with `devNodes` it is the cached tarball as it is, its
 * /dev/null, /dev/full, ... included (as a rootfs made with debootstrap and pushed would be).
 * Made once per tarball and kept in `<tmpdir>/forkd-oci-test-images/` (written aside, then
 * renamed).
 */
export async function debootstrapLayer(
  cache = "/var/cache/forkd",
  o: { devNodes?: boolean } = {},
): Promise<{ file: string; compression: "zstd"; diffId: string }> {
  const src = await debootstrapTarball(cache);
  const key = createHash("sha256")
    .update(src)
    .update(String((await stat(src)).mtimeMs))
    .digest("hex")
    .slice(0, 16);
  const out = join(tmpdir(), "forkd-oci-test-images");
  await mkdir(out, { recursive: true });
  const layer = o.devNodes ? src : join(out, `debian-${key}.tar.zst`);
  const idFile = o.devNodes ? join(out, `debian-${key}-with-dev.diffid`) : `${layer}.diffid`;
  const ready = await stat(idFile).then(
    () => true,
    () => false,
  );
  if (!ready) {
    const tmp = join(out, `.tmp-${process.pid}-${randomBytes(4).toString("hex")}`);
    try {
      await sh("bash", [
        "-c",
        o.devNodes
          ? `set -o pipefail; zstd -dcq "$1" | sha256sum | cut -d' ' -f1 > "$2.id"`
          : `set -o pipefail; zstd -dcq "$1" | tar --delete --wildcards './dev/*' > "$2.tar" && sha256sum "$2.tar" | cut -d' ' -f1 > "$2.id" && zstd -q -T2 -3 --rm "$2.tar" -o "$2.zst"`,
        "bash",
        src,
        tmp,
      ]);
      const diffId = `sha256:${readFileSync(`${tmp}.id`, "utf8").trim()}`;
      if (!o.devNodes) await rename(`${tmp}.zst`, layer);
      await writeFile(`${tmp}.id2`, diffId);
      await rename(`${tmp}.id2`, idFile);
    } finally {
      for (const x of [".tar", ".id", ".zst", ".id2"]) await rm(`${tmp}${x}`, { force: true });
    }
  }
  return { file: layer, compression: "zstd", diffId: readFileSync(idFile, "utf8").trim() };
}

// ---------------------------------------------------------------- all at once

export interface TestImages {
  busybox: PushedImage;
  /** The multi-layer image, gzip layers, OCI manifest. */
  multi: PushedImage;
  /** The same layers zstd-compressed, under an OCI index. */
  multiZstdIndex: PushedImage;
  /** The same layers uncompressed, Docker schema 2 under a manifest list. */
  multiDockerList: PushedImage;
}

/** Pushes the busybox and multi-layer images (and their variants) to `host`. */
export async function pushTestImages(host: string): Promise<TestImages> {
  const tars = multiLayerTars();
  return {
    busybox: await pushImage(
      host,
      "forkd-test/busybox",
      "latest",
      [{ tar: busyboxTar(), compression: "gzip" }],
      {
        config: { ...TEST_CONFIG, WorkingDir: "/" },
      },
    ),
    multi: await pushImage(
      host,
      "forkd-test/multi",
      "gzip",
      tars.map((tar) => ({ tar, compression: "gzip" as const })),
      { config: TEST_CONFIG },
    ),
    multiZstdIndex: await pushImage(
      host,
      "forkd-test/multi",
      "zstd-index",
      tars.map((tar) => ({ tar, compression: "zstd" as const })),
      {
        config: TEST_CONFIG,
        index: true,
      },
    ),
    multiDockerList: await pushImage(
      host,
      "forkd-test/multi",
      "docker-list",
      tars.map((tar) => ({ tar, compression: "none" as const })),
      {
        config: TEST_CONFIG,
        index: true,
        format: "docker",
      },
    ),
  };
}

/**
 * Pushes the Debian image (`host/<repo>:latest`, by default `forkd-test/debian`: the python
 * template's debootstrap tree, python3 and numpy).
 */
export async function pushDebianImage(
  host: string,
  cache = "/var/cache/forkd",
  repo = "forkd-test/debian",
): Promise<PushedImage> {
  const layer = await debootstrapLayer(cache);
  return pushImage(host, repo, "latest", [layer], {
    config: {
      Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
      Cmd: ["bash"],
    },
  });
}

/** Pushes each hostile layer set as `host/forkd-test/hostile:<name>`. */
export async function pushHostileImages(
  host: string,
): Promise<Record<string, PushedImage & { entry: string; why: RegExp }>> {
  const out: Record<string, PushedImage & { entry: string; why: RegExp }> = {};
  for (const [name, h] of Object.entries(hostileTars())) {
    const img = await pushImage(
      host,
      "forkd-test/hostile",
      name,
      h.layers.map((tar) => ({ tar, compression: "gzip" as const })),
    );
    out[name] = { ...img, entry: h.entry, why: h.why };
  }
  return out;
}
