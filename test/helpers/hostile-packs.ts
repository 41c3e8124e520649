/**
 * Hostile snapshot packs for POST /v1/snapshots/unpack: archives a careless unpacker would let
 * write outside its staging directory, or fail on with an unhandled error. Tars are made with
 * Python's tarfile (which writes any name, link or device asked of it), compressed with zstd.
 * Every name aimed outside contains `token`, so what escaped can be found by name.
 *
 * None is a decompression bomb: what they expand to stays tiny whatever the unpacker does.
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import type { Rng } from "./rng.js";

const PYTHON = "/usr/bin/python3";

/** One tar entry: a file (data), dir, symlink/hardlink (link), chr/fifo device. */
interface Entry {
  name: string;
  type: "file" | "dir" | "symlink" | "hardlink" | "chr" | "fifo";
  data?: string;
  link?: string;
  /** Size stated in the header (files), when it should differ from the data's. */
  statedSize?: number;
}

const PY = `
import io, json, sys, tarfile
entries = json.load(sys.stdin)
out = io.BytesIO()
with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
    for e in entries:
        i = tarfile.TarInfo(e["name"])
        data = e.get("data", "").encode()
        kind = e["type"]
        i.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                  "hardlink": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[kind]
        i.mode = 0o755 if kind == "dir" else 0o644
        if kind in ("symlink", "hardlink"):
            i.linkname = e["link"]
        if kind == "chr":
            i.devmajor, i.devminor = 1, 3
        if kind == "file":
            i.size = len(data)
            t.addfile(i, io.BytesIO(data))
        else:
            t.addfile(i)
raw = out.getvalue()
for e in entries:
    if "statedSize" in e:
        # Rewrite the size field of that entry's header (octal, 12 bytes at offset 124).
        name = e["name"].encode()
        at = raw.find(name + b"\\0")
        size = (b"%011o" % e["statedSize"]) + b"\\0"
        raw = raw[:at + 124] + size + raw[at + 136:]
        # Header checksum (offset 148, 8 bytes) over the header with the field as spaces.
        hdr = raw[at:at + 512]
        hdr = hdr[:148] + b" " * 8 + hdr[156:]
        chk = b"%06o\\0 " % sum(hdr)
        raw = raw[:at + 148] + chk + raw[at + 156:]
sys.stdout.buffer.write(raw)
`;

async function tar(entries: Entry[]): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      PYTHON,
      ["-c", PY],
      { encoding: "buffer", maxBuffer: 64 << 20, timeout: 30_000 },
      (err, stdout, stderr) => (err ? reject(new Error(`tar: ${String(stderr)}`)) : resolve(stdout)),
    );
    child.stdin?.end(JSON.stringify(entries));
  });
}

async function zstd(data: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      "zstd",
      ["-q", "-c", "-3"],
      { encoding: "buffer", maxBuffer: 64 << 20, timeout: 30_000 },
      (err, stdout) => (err ? reject(new Error(`zstd: ${err.message}`)) : resolve(stdout)),
    );
    child.stdin?.end(data);
  });
}

const sha = (s: string): string => createHash("sha256").update(s).digest("hex");

/** A manifest listing `files` (path → content) with their true sizes and checksums. */
function manifest(tag: string, files: Record<string, string>, over: Record<string, unknown> = {}): string {
  return JSON.stringify({
    format: "forkd-pack/1",
    created: new Date(0).toISOString(),
    tag,
    chain: [tag],
    image: { hash: "0".repeat(64), template: "python", kernelVersion: "0" },
    files: Object.fromEntries(
      Object.entries(files).map(([p, d]) => [p, { size: Buffer.byteLength(d), sha256: sha(d) }]),
    ),
    ...over,
  });
}

/** A pack laid out as a real one is, with these snapshot files (meta.json etc.) for `tag`. */
async function packOf(tag: string, files: Record<string, string>, over: Record<string, unknown> = {}) {
  const entries: Entry[] = [
    { name: "manifest.json", type: "file", data: manifest(tag, files, over) },
    { name: "snapshots", type: "dir" },
    { name: `snapshots/${tag}`, type: "dir" },
    ...Object.entries(files).map(([name, data]): Entry => ({ name, type: "file", data })),
  ];
  return zstd(await tar(entries));
}

export interface HostilePack {
  name: string;
  body: Buffer;
}

export async function hostilePacks(r: Rng, token: string): Promise<HostilePack[]> {
  const tag = `fzp${token}`.slice(0, 60);
  const out: HostilePack[] = [];
  const add = (name: string, body: Buffer) => out.push({ name, body });
  const escape = `escape-${token}`;

  add("empty body", Buffer.alloc(0));
  add("random bytes", r.bytes(4096));
  add("zstd of random bytes", await zstd(r.bytes(8192)));
  add("an uncompressed tar", await tar([{ name: "manifest.json", type: "file", data: "{}" }]));
  const whole = await packOf(tag, { [`snapshots/${tag}/meta.json`]: "{}" });
  add("truncated zstd", whole.subarray(0, Math.floor(whole.length / 2)));
  add("zstd with its last bytes flipped", Buffer.concat([whole.subarray(0, -8), r.bytes(8)]));
  add(
    "names with ..",
    await zstd(
      await tar([
        { name: `../../${escape}`, type: "file", data: "x" },
        { name: `snapshots/../../../${escape}-b`, type: "file", data: "x" },
      ]),
    ),
  );
  add("an absolute name", await zstd(await tar([{ name: `/tmp/${escape}`, type: "file", data: "x" }])));
  add(
    "a symlink out, then a file through it",
    await zstd(
      await tar([
        { name: "image", type: "symlink", link: "/tmp" },
        { name: `image/${escape}`, type: "file", data: "x" },
      ]),
    ),
  );
  add(
    "a symlink to /etc/passwd named like a pack file",
    await zstd(
      await tar([
        { name: "manifest.json", type: "symlink", link: "/etc/passwd" },
        { name: "image", type: "dir" },
        { name: "image/rootfs.ext4", type: "symlink", link: `../../../../tmp/${escape}` },
      ]),
    ),
  );
  add(
    "a hard link to a host file",
    await zstd(
      await tar([
        { name: "snapshots", type: "dir" },
        { name: `snapshots/${tag}`, type: "dir" },
        { name: `snapshots/${tag}/memory`, type: "hardlink", link: "/etc/passwd" },
      ]),
    ),
  );
  add(
    "a character device and a fifo",
    await zstd(
      await tar([
        { name: "image", type: "dir" },
        { name: "image/rootfs.ext4", type: "chr" },
        { name: "image/vmlinuz", type: "fifo" },
      ]),
    ),
  );
  add("an invalid meta.json (valid JSON)", whole);
  add("a meta.json that is not JSON", await packOf(tag, { [`snapshots/${tag}/meta.json`]: "{not json" }));
  add(
    "a manifest that is not JSON",
    await zstd(await tar([{ name: "manifest.json", type: "file", data: "\u0000{" }])),
  );
  add(
    "a manifest stating a huge file size",
    await zstd(
      await tar([
        {
          name: "manifest.json",
          type: "file",
          data: manifest(
            tag,
            {},
            { files: { [`snapshots/${tag}/memory`]: { size: 2 ** 52, sha256: "0".repeat(64) } } },
          ),
        },
      ]),
    ),
  );
  add(
    "a tar header stating 64 GiB with 1 byte of data",
    await zstd(
      await tar([
        { name: "manifest.json", type: "file", data: "{}" },
        { name: `snapshots/${tag}/memory`, type: "file", data: "x", statedSize: 64 * 2 ** 30 },
      ]),
    ),
  );
  add(
    "a manifest whose tag and chain traverse",
    await packOf(
      tag,
      { [`snapshots/${tag}/meta.json`]: "{}" },
      { tag: `../../${escape}`, chain: [`../../${escape}`] },
    ),
  );
  add(
    "a manifest listing a path outside the pack",
    await zstd(
      await tar([
        {
          name: "manifest.json",
          type: "file",
          data: manifest(tag, {}, { files: { [`../../${escape}`]: { size: 1, sha256: sha("x") } } }),
        },
      ]),
    ),
  );
  return out;
}
