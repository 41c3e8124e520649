/**
 * The one tar reader (src/archive/tar-reader.ts) under its three profiles: packs, image layers
 * and build contexts. Every hostile-archive case the two earlier readers' tests had is here (the
 * pack-level ones stay in pack-unpack.test.ts, through unpack), and the bounds each profile
 * keeps from the reader it replaces.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtemp, open, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { TarReader } from "../../src/archive/tar-reader.js";
import type { TarEntry, TarSink } from "../../src/archive/tar-reader.js";
import { parseNumber, staysInside } from "../../src/archive/tar-fields.js";
import { CONTEXT_TAR, PACK_TAR, layerTar } from "../../src/archive/tar-profiles.js";
import type { TarProfile } from "../../src/archive/tar-profiles.js";
import { sha256File } from "../../src/snapshot/meta.js";
import { ForkdError } from "../../src/util/errors.js";
import { tarHeader } from "../helpers/forge-pack.js";
import { makeTar } from "../helpers/oci-images.js";

const sh = promisify(execFile);
const fail = (why: string) => new ForkdError("invalid_argument", why);

async function scratchDir(): Promise<{ root: string; done: () => Promise<void> }> {
  const root = await mkdtemp(join(tmpdir(), "forkd-tar-"));
  return { root, done: () => rm(root, { recursive: true, force: true }) };
}

/** Reads `tar` whole under `profile`; the entries the sink saw. */
async function read(tar: Buffer, profile: TarProfile): Promise<TarEntry[]> {
  const seen: TarEntry[] = [];
  const sink: TarSink = {
    entry: (e) => {
      seen.push(e);
      return Promise.resolve();
    },
    data: () => Promise.resolve(),
    end: () => Promise.resolve(),
  };
  const r = new TarReader(sink, profile);
  await r.push(tar);
  r.finish();
  return seen;
}

/** Recomputes a hand-edited header's checksum. */
function resum(h: Buffer, at = 0): Buffer {
  h.fill(0x20, at + 148, at + 156);
  let sum = 0;
  for (let i = at; i < at + 512; i++) sum += h[i] ?? 0;
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", at + 148, "latin1");
  return h;
}

const END = Buffer.alloc(1024);

test("layer reader: truncated, corrupt and unsupported tars are refused; pax xattrs are bytes", async () => {
  const entries: TarEntry[] = [];
  const sink = {
    entry: (e: TarEntry) => {
      entries.push(e);
      return Promise.resolve();
    },
    data: () => Promise.resolve(),
    end: () => Promise.resolve(),
  };
  const bin = Buffer.from([0, 1, 2, 0xff, 0x0a, 0x3d]);
  const r = new TarReader(sink, layerTar("t"));
  await r.push(
    makeTar([
      { name: "f", data: "x", xattrs: { "user.bin": bin } },
      { name: `${"d/".repeat(80)}f`, data: "y" },
    ]),
  );
  r.finish();
  assert.deepEqual(entries[0]?.xattrs.get("user.bin"), bin);
  assert.equal(entries[1]?.name, `${"d/".repeat(80)}f`);

  // Device nodes and FIFOs reach the sink (it decides what it admits); with data they are refused.
  entries.length = 0;
  const nodes = new TarReader(sink, layerTar("t"));
  await nodes.push(
    makeTar([
      { name: "./dev/full", type: "char", devmajor: 1, devminor: 7, mode: 0o666 },
      { name: "./dev/sda", type: "block", devmajor: 8, devminor: 0, mode: 0o660 },
      { name: "./dev/initctl", type: "fifo", mode: 0o600 },
    ]),
  );
  nodes.finish();
  assert.deepEqual(
    entries.map((e) => [e.name, e.type, e.size]),
    [
      ["./dev/full", "char", 0],
      ["./dev/sda", "block", 0],
      ["./dev/initctl", "fifo", 0],
    ],
  );
  const withData = makeTar([{ name: "c", data: "xyz" }]);
  withData[156] = "3".charCodeAt(0);
  withData.fill(0x20, 148, 156);
  let s3 = 0;
  for (let i = 0; i < 512; i++) s3 += withData[i] ?? 0;
  withData.write(s3.toString(8).padStart(6, "0") + "\0 ", 148, "latin1");
  await assert.rejects(
    new TarReader(sink, layerTar("t")).push(withData),
    /entry "c": a char entry with data/,
  );

  const full = makeTar([{ name: "f", data: Buffer.alloc(2000) }]);
  const cut = new TarReader(sink, layerTar("t"));
  await cut.push(full.subarray(0, 1000));
  assert.throws(() => cut.finish(), /truncated/);

  const corrupt = Buffer.from(full);
  corrupt[10] = 0x41;
  await assert.rejects(new TarReader(sink, layerTar("t")).push(corrupt), /checksum/);

  const weird = makeTar([{ name: "s", data: "" }]);
  weird[156] = "S".charCodeAt(0);
  let sum = 0;
  weird.fill(0x20, 148, 156);
  for (let i = 0; i < 512; i++) sum += weird[i] ?? 0;
  weird.write(sum.toString(8).padStart(6, "0") + "\0 ", 148, "latin1");
  await assert.rejects(
    new TarReader(sink, layerTar("t")).push(weird),
    /entry "s": tar entry type "S" is not supported/,
  );
});

test("the tar reader restores GNU sparse members exactly, data at its offsets and holes as zeros", async () => {
  const s = await scratchDir();
  try {
    const f = join(s.root, "sparse.bin");
    await writeFile(f, "");
    await truncate(f, 40 << 20);
    const fh = await open(f, "r+");
    for (const [at, text] of [
      [4096, "first"],
      [9 << 20, "second"],
      [(40 << 20) - 3, "end"],
    ] as const) {
      await fh.write(text, at);
    }
    await fh.close();
    const { stdout } = await sh("sh", ["-c", `tar --sparse -cf - -C ${s.root} sparse.bin | base64 -w0`], {
      maxBuffer: 1 << 26,
    });
    const tarBytes = Buffer.from(stdout, "base64");
    assert.ok(tarBytes.length < 1 << 20, "stored sparse");
    const h = createHash("sha256");
    let size = -1;
    let pos = 0;
    const reader = new TarReader(
      {
        entry: (e) => {
          size = e.size;
          return Promise.resolve();
        },
        data: (chunk, offset) => {
          h.update(Buffer.alloc(offset - pos));
          h.update(chunk);
          pos = offset + chunk.length;
          return Promise.resolve();
        },
        end: () => {
          h.update(Buffer.alloc(size - pos));
          return Promise.resolve();
        },
      },
      PACK_TAR,
    );
    for (let i = 0; i < tarBytes.length; i += 1000) await reader.push(tarBytes.subarray(i, i + 1000));
    reader.finish();
    assert.equal(size, 40 << 20);
    assert.equal(h.digest("hex"), (await sha256File(f)).sha256);
    assert.equal(parseNumber(Buffer.from([0x80, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]), fail), 2 ** 32);
  } finally {
    await s.done();
  }
});

test("tar reader: a pack or a context holds files and directories only; a layer every node type", async () => {
  const nodes = makeTar([
    { name: "l", type: "symlink", linkname: "x" },
    { name: "h", type: "hardlink", linkname: "l" },
    { name: "f", type: "fifo" },
  ]);
  for (const profile of [PACK_TAR, CONTEXT_TAR]) {
    await assert.rejects(read(nodes, profile), (e: unknown) => {
      assert.ok(e instanceof ForkdError && e.code === "invalid_argument");
      assert.match(
        e.message,
        /entry "l": tar entry type "2" is not supported \(not a plain file or directory\)/,
      );
      assert.ok(e.message.startsWith(`${profile.label}: `), e.message);
      assert.equal(e.details.entry, "l");
      return true;
    });
  }
  assert.deepEqual(
    (await read(nodes, layerTar("t"))).map((e) => [e.type, e.linkname]),
    [
      ["symlink", "x"],
      ["hardlink", "l"],
      ["fifo", ""],
    ],
  );
});

test("tar reader: GNU link names and pax global headers are a layer's, refused in a pack", async () => {
  const longLink = Buffer.concat([
    tarHeader("././@LongLink", 5, "K"),
    Buffer.from("a".repeat(5)),
    Buffer.alloc(507),
  ]);
  const global = Buffer.concat([tarHeader("g", 9, "g"), Buffer.from("9 a=bcde\n"), Buffer.alloc(503)]);
  for (const ext of [longLink, global]) {
    const tar = Buffer.concat([ext, makeTar([{ name: "f", data: "x" }])]);
    await assert.rejects(read(tar, PACK_TAR), /is not supported \(not a plain file or directory\)/);
    assert.deepEqual(
      (await read(tar, layerTar("t"))).map((e) => e.name),
      ["f"],
    );
  }
});

test("tar reader: headers without the ustar magic (v7) are read in layers only", async () => {
  const tar = makeTar([{ name: "f", data: "x" }]);
  tar.fill(0, 257, 265);
  resum(tar);
  await assert.rejects(read(tar, PACK_TAR), /not a readable pack: not a ustar or GNU tar archive/);
  assert.deepEqual(
    (await read(tar, layerTar("t"))).map((e) => e.name),
    ["f"],
  );
});

test("tar reader: an extended header beyond its profile's bound is refused before it is read", async () => {
  const big = "d/".repeat(40_000) + "f"; // a pax path record over 64 KiB
  const tar = makeTar([{ name: big, data: "x" }]);
  await assert.rejects(read(tar, PACK_TAR), /an extended header larger than 65536 bytes/);
  await assert.rejects(
    read(tar, CONTEXT_TAR),
    /build context: not a readable tar: an extended header larger/,
  );
  assert.equal((await read(tar, layerTar("t")))[0]?.name, big);
  const huge = makeTar([{ name: "d/".repeat(600_000) + "f", data: "x" }]);
  await assert.rejects(read(huge, layerTar("t")), /t: an extended header larger than 1048576 bytes/);
});

test("tar reader: the number of headers is bounded (a pack: 65,536; a layer: by its image's entries)", async () => {
  const one = makeTar([{ name: "d", type: "dir" }]).subarray(0, 512);
  const many = (n: number) => Buffer.concat([...Array.from({ length: n }, () => one), END]);
  await assert.rejects(read(many(11 + 4 * 10 + 1024), layerTar("t", 10)), /t: more than 1064 tar headers/);
  assert.equal((await read(many(1064), layerTar("t", 10))).length, 1064);
  await assert.rejects(read(many((1 << 16) + 1), PACK_TAR), /more than 65536 tar headers/);
});

test("tar reader: every profile refuses NUL in names, data in a non-file, and an archive cut after an extended header", async () => {
  for (const profile of [PACK_TAR, CONTEXT_TAR, layerTar("t")]) {
    // A pax path holding a NUL byte.
    const nul = makeTar([{ name: "a\0b".padEnd(120, "c"), data: "x" }]);
    await assert.rejects(read(nul, profile), /a name holds a NUL byte/);
    const dir = Buffer.concat([tarHeader("d", 512, "5"), Buffer.alloc(512, 0x41), END]);
    await assert.rejects(read(dir, profile), /entry "d": a directory entry with data/);
    const cut = makeTar([{ name: "x".repeat(150), data: "x" }]).subarray(0, 1024); // pax header, no member
    const r = new TarReader(
      { entry: () => Promise.resolve(), data: () => Promise.resolve(), end: () => Promise.resolve() },
      profile,
    );
    await r.push(cut);
    assert.throws(() => r.finish(), /ends after an extended header/);
    await assert.rejects(read(Buffer.concat([cut, END]), profile), /ends after an extended header/);
  }
});

test("tar reader: pax sparse members are refused by every profile; old-GNU sparse ones read by packs only", async () => {
  const record = "22 GNU.sparse.major=1\n";
  const pax = Buffer.concat([
    tarHeader("p", record.length, "x"),
    Buffer.from(record),
    Buffer.alloc(512 - record.length),
  ]);
  const tar = Buffer.concat([pax, makeTar([{ name: "f", data: "x" }])]);
  for (const profile of [PACK_TAR, layerTar("t")])
    await assert.rejects(read(tar, profile), /pax sparse members are not supported/);
});

test("tar reader: a path stays inside only relative, without . or .. or empty components", () => {
  for (const ok of ["", "a", "a/b", "a/.b", "a..b"]) assert.ok(staysInside(ok), ok);
  for (const no of ["/a", "..", "a/../b", "a/./b", "a//b", "."]) assert.ok(!staysInside(no), no);
});
