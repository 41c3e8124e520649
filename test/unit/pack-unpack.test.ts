/**
 * Unpacking hostile packs without a VM: fake but complete packs (real qcow2 layers, checksummed
 * metadata) are unpacked into a scratch store and image cache. The guest image is installed
 * under the content address of its files, never the build hash a pack claims; archives that
 * expand past their manifest or the limit are refused before they are written; bad metadata,
 * broken archives and odd members are clear 400s that leave nothing behind.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createReadStream } from "node:fs";
import { cp, mkdir, mkdtemp, readdir, readFile, rm, stat, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { builtImageAddress, findImage, imageAddress, recordedImageSums } from "../../src/image/content.js";
import { sha256File, writeMeta } from "../../src/snapshot/meta.js";
import { PACK_FORMAT } from "../../src/snapshot/pack.js";
import type { PackManifest, UnpackDeps } from "../../src/snapshot/pack.js";
import { SnapshotStore } from "../../src/snapshot/store.js";
import { UnpackBudget, unpackLimit } from "../../src/snapshot/unpack-budget.js";
import { unpackSnapshot } from "../../src/snapshot/unpack.js";
import { ForkdError } from "../../src/util/errors.js";
import { forgePack } from "../helpers/forge-pack.js";
import { fakeMeta } from "../helpers/snapshots.js";
import { testTools } from "../helpers/tools.js";

const sh = promisify(execFile);
// qemu-img on the packs' layers runs as the daemon runs it: jailed when root.
const { tools, release } = await testTools();
after(release);
const H = "ab".repeat(32); // the build hash every fake pack claims

async function scratch(): Promise<{ root: string; deps: UnpackDeps; done: () => Promise<void> }> {
  const root = await mkdtemp(join(tmpdir(), "forkd-unpack-"));
  await mkdir(join(root, "snapshots"));
  const store = new SnapshotStore(join(root, "snapshots"));
  return {
    root,
    deps: { store, cacheDir: join(root, "cache"), accel: "tcg", viewer: null, tools },
    done: () => rm(root, { recursive: true, force: true }),
  };
}

const sumsOf = async (dir: string, files: string[]) =>
  Object.fromEntries(await Promise.all(files.map(async (f) => [f, await sha256File(join(dir, f))] as const)));

/** A build-style image manifest for these files (what guest/image/build.sh writes). */
async function imageManifest(dir: string): Promise<string> {
  const files = await sumsOf(dir, ["vmlinuz", "initrd.img", "rootfs.ext4"]);
  return JSON.stringify({ format: 2, template: "python", kernel_version: "6", image_hash: H, files });
}

/** Lays out a one-snapshot pack in `dir` (its image's rootfs gets `rootfsText`). */
async function fakePack(dir: string, rootfsText = "the real rootfs"): Promise<PackManifest> {
  const img = join(dir, "image");
  const snap = join(dir, "snapshots", "t1");
  await mkdir(img, { recursive: true });
  await mkdir(snap, { recursive: true });
  await writeFile(join(img, "vmlinuz"), "kernel");
  await writeFile(join(img, "initrd.img"), "initrd");
  await writeFile(join(img, "rootfs.ext4"), "");
  await truncate(join(img, "rootfs.ext4"), 1 << 20);
  await writeFile(join(img, "rootfs.ext4"), rootfsText, { flag: "r+" });
  await writeFile(join(img, "manifest.json"), await imageManifest(img));
  await writeFile(join(snap, "memory"), Buffer.alloc(65536, 7));
  await writeFile(join(snap, "vmstate"), "devices");
  await sh("qemu-img", [
    "create",
    "-q",
    "-f",
    "qcow2",
    "-u",
    "-b",
    "/nonexistent",
    "-F",
    "raw",
    join(snap, "disk.qcow2"),
    "1M",
  ]);
  const f = await sumsOf(snap, ["memory", "vmstate", "disk.qcow2"]);
  await writeMeta(join(snap, "meta.json"), {
    ...fakeMeta("t1", null, { memory: f.memory!, vmstate: f.vmstate!, disk: f["disk.qcow2"]! }),
    image: { hash: H, dir: "/elsewhere", kernelVersion: "6" },
  });
  return writeManifest(dir);
}

/** (Re)writes `dir`'s manifest.json from the files there: what a forger does after editing. */
async function writeManifest(dir: string): Promise<PackManifest> {
  const paths = [
    ...["vmlinuz", "initrd.img", "rootfs.ext4", "manifest.json"].map((f) => `image/${f}`),
    ...["meta.json", "memory", "vmstate", "disk.qcow2"].map((f) => `snapshots/t1/${f}`),
  ];
  const m: PackManifest = {
    format: PACK_FORMAT,
    created: new Date().toISOString(),
    tag: "t1",
    chain: ["t1"],
    image: { hash: H, template: "python", kernelVersion: "6" },
    files: await sumsOf(dir, paths),
  };
  await writeFile(join(dir, "manifest.json"), JSON.stringify(m));
  return m;
}

async function tarZst(
  dir: string,
  out: string,
  members = ["manifest.json", "image", "snapshots"],
): Promise<string> {
  await sh("tar", ["--zstd", "--sparse", "-cf", out, "-C", dir, ...members]);
  return out;
}

const unpack = (deps: UnpackDeps, file: string, as?: string) =>
  unpackSnapshot(deps, createReadStream(file), as ? { as } : {});

const rejectsWith = (p: Promise<unknown>, code: string, re: RegExp) =>
  assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof ForkdError, `a ForkdError, not ${String(e)}`);
    assert.equal(e.code, code, e.message);
    assert.match(e.message, re);
    return true;
  });

/** Nothing staged, nothing published. */
async function assertClean(deps: UnpackDeps): Promise<void> {
  assert.deepEqual(await readdir(deps.store.root), []);
  assert.deepEqual(await readdir(join(deps.cacheDir, "imported")).catch(() => []), []);
}

/** A built image in the cache under `H`, as the builder leaves it (with its provenance record). */
async function builtImage(cacheDir: string, from: string): Promise<string> {
  const d = join(cacheDir, "images", H);
  await mkdir(join(cacheDir, "images"), { recursive: true });
  await cp(from, d, { recursive: true });
  await writeFile(join(d, "provenance"), `built-by=guest/image/build.sh\nimage_hash=${H}\n`);
  return d;
}

const treeSums = async (d: string) => JSON.stringify(await sumsOf(d, (await readdir(d)).sort()));

test("a pack's image is installed under its content address, never under the build hash it claims", async () => {
  const s = await scratch();
  try {
    // The host built H; the pack claims H for a different root filesystem.
    const real = join(s.root, "real");
    await fakePack(real);
    const built = await builtImage(s.deps.cacheDir, join(real, "image"));
    const before = await treeSums(built);
    const planted = join(s.root, "planted");
    const m = await fakePack(planted, "a PLANTED rootfs");
    const r = await unpack(s.deps, await tarZst(planted, join(s.root, "planted.tar.zst")));
    assert.deepEqual(r.published, ["t1"]);

    const address = imageAddress({
      vmlinuz: m.files["image/vmlinuz"]!,
      "initrd.img": m.files["image/initrd.img"]!,
      "rootfs.ext4": m.files["image/rootfs.ext4"]!,
      "manifest.json": m.files["image/manifest.json"]!,
    });
    const meta = (await s.deps.store.get("t1")).meta;
    assert.equal(meta.image.dir, join(s.deps.cacheDir, "imported", address));
    assert.equal(meta.image.content, address);
    assert.match(await readFile(join(meta.image.dir, "rootfs.ext4"), "latin1"), /^a PLANTED rootfs/);
    // The builder's image is untouched and still the only one under images/.
    assert.equal(await treeSums(built), before);
    assert.deepEqual(await readdir(join(s.deps.cacheDir, "images")), [H]);
    assert.equal(await findImage(s.deps.cacheDir, address), meta.image.dir);
    assert.notEqual(await builtImageAddress(built), address);
  } finally {
    await s.done();
  }
});

test("a pack whose image this host built (same files) reuses it; an image without provenance is not", async () => {
  const s = await scratch();
  try {
    const dir = join(s.root, "p");
    await fakePack(dir);
    const file = await tarZst(dir, join(s.root, "p.tar.zst"));
    // Same files under images/H but no provenance record (an old unpack's, or made by hand).
    const d = await builtImage(s.deps.cacheDir, join(dir, "image"));
    await rm(join(d, "provenance"));
    await unpack(s.deps, file, "a1");
    assert.match((await s.deps.store.get("a1")).meta.image.dir, /\/imported\/[0-9a-f]{64}$/);
    await s.deps.store.delete("a1");
    await rm(join(s.deps.cacheDir, "imported"), { recursive: true });
    await writeFile(join(d, "provenance"), `built-by=guest/image/build.sh\nimage_hash=${H}\n`);
    await unpack(s.deps, file, "a2");
    assert.equal((await s.deps.store.get("a2")).meta.image.dir, d);
    assert.deepEqual(await readdir(join(s.deps.cacheDir, "imported")).catch(() => []), []);
  } finally {
    await s.done();
  }
});

test("an image's recorded sums are believed only for the builder's images and content-addressed ones", async () => {
  const s = await scratch();
  try {
    const dir = join(s.root, "p");
    await fakePack(dir);
    const real = await sumsOf(join(dir, "image"), ["vmlinuz", "initrd.img", "rootfs.ext4", "manifest.json"]);
    // Built here (provenance): the builder's record. Without provenance, under another name: none.
    const built = await builtImage(s.deps.cacheDir, join(dir, "image"));
    assert.deepEqual(await recordedImageSums(built), real);
    await rm(join(built, "provenance"));
    assert.equal(await recordedImageSums(built), null);
    // Installed by an unpack under its content address: the sums that make that address.
    await unpack(s.deps, await tarZst(dir, join(s.root, "p.tar.zst")), "a1");
    const imported = (await s.deps.store.get("a1")).meta.image.dir;
    assert.match(imported, /\/imported\/[0-9a-f]{64}$/);
    assert.deepEqual(await recordedImageSums(imported), real);
    // A manifest whose recorded sums are not those of its files makes another address: not believed.
    const lying = join(s.root, "cache", "imported", "cd".repeat(32));
    await cp(imported, lying, { recursive: true });
    assert.equal(await recordedImageSums(lying), null);
  } finally {
    await s.done();
  }
});

test("a bomb is refused before it is written: past its stated size, past the limit, sparse, manifest last", async () => {
  const s = await scratch();
  try {
    const dir = join(s.root, "p");
    const m = await fakePack(dir);
    const manifest = await readFile(join(dir, "manifest.json"));
    const big = 256 << 20;
    // 256 MiB of 'A' (not zeros: no hole saves the disk) where the manifest says 64 KiB.
    const bomb = await forgePack(join(s.root, "bomb.tar.zst"), [
      ["manifest.json", manifest.length, manifest],
      ["snapshots/t1/memory", big, 0x41],
    ]);
    assert.ok((await stat(bomb)).size < 64 << 10, "a small archive");
    await rejectsWith(
      unpack(s.deps, bomb),
      "invalid_argument",
      /snapshots\/t1\/memory is 268435456 bytes; its manifest says 65536/,
    );
    await assertClean(s.deps);

    // The manifest last (as older packs have it): found first, then the same refusal.
    const last = await forgePack(join(s.root, "last.tar.zst"), [
      ["snapshots/t1/memory", big, 0x41],
      ["manifest.json", manifest.length, manifest],
    ]);
    await rejectsWith(
      unpack(s.deps, last),
      "invalid_argument",
      /is 268435456 bytes; its manifest says 65536/,
    );
    await assertClean(s.deps);

    // An honest manifest past the configured limit: refused before the first file.
    const honest = {
      ...m,
      files: { ...m.files, "snapshots/t1/memory": { size: big, sha256: "0".repeat(64) } },
    };
    const hm = Buffer.from(JSON.stringify(honest));
    const over = await forgePack(join(s.root, "over.tar.zst"), [
      ["manifest.json", hm.length, hm],
      ["snapshots/t1/memory", big, 0x41],
    ]);
    await rejectsWith(
      unpack({ ...s.deps, maxBytes: 16 << 20 }, over),
      "payload_too_large",
      /FORKD_UNPACK_MAX_MIB/,
    );
    await assertClean(s.deps);

    // A sparse member claiming a terabyte (GNU tar stores only its map).
    await truncate(join(dir, "snapshots", "t1", "memory"), 2 ** 40);
    const sparse = await tarZst(dir, join(s.root, "sparse.tar.zst"));
    await rejectsWith(
      unpack(s.deps, sparse),
      "invalid_argument",
      /memory is 1099511627776 bytes; its manifest says 65536/,
    );
    await assertClean(s.deps);
  } finally {
    await s.done();
  }
});

test("bad metadata, broken archives and odd members are clear 400s that leave nothing behind", async () => {
  const s = await scratch();
  try {
    const dir = join(s.root, "p");
    await fakePack(dir);
    const good = await tarZst(dir, join(s.root, "good.tar.zst"));
    const bytes = await readFile(good);

    // meta.json with a bad field, the manifest's sums updated to match (a forger's pack).
    const metaPath = join(dir, "snapshots", "t1", "meta.json");
    const meta = JSON.parse(await readFile(metaPath, "utf8")) as { machine: { accel: string } };
    const saved = await readFile(metaPath);
    meta.machine.accel = "arm";
    await writeFile(metaPath, JSON.stringify(meta));
    await writeManifest(dir);
    const badMeta = await tarZst(dir, join(s.root, "badmeta.tar.zst"));
    await assert.rejects(unpack(s.deps, badMeta), (e: unknown) => {
      assert.ok(e instanceof ForkdError && e.code === "invalid_argument", String(e));
      assert.match(e.message, /snapshots\/t1\/meta\.json is invalid: machine\.accel/);
      assert.equal(e.details.field, "machine.accel");
      return true;
    });
    await writeFile(metaPath, "{not json");
    await writeManifest(dir);
    await rejectsWith(
      unpack(s.deps, await tarZst(dir, join(s.root, "nojson.tar.zst"))),
      "invalid_argument",
      /meta\.json is not JSON/,
    );
    await writeFile(metaPath, saved);
    await writeManifest(dir);
    await assertClean(s.deps);

    const m = JSON.parse(await readFile(join(dir, "manifest.json"), "utf8")) as PackManifest;
    const manifestCase = async (name: string, edit: (x: PackManifest) => unknown, re: RegExp) => {
      const raw = Buffer.from(JSON.stringify(edit(structuredClone(m))));
      const f = await forgePack(join(s.root, `${name}.tar.zst`), [["manifest.json", raw.length, raw]]);
      await rejectsWith(unpack(s.deps, f), "invalid_argument", re);
    };
    await manifestCase("wrongtype", (x) => ({ ...x, chain: "t1" }), /pack manifest is invalid: chain/);
    await manifestCase("badtag", (x) => ({ ...x, chain: ["../x"], tag: "../x" }), /bad tag in its chain/);
    await manifestCase("twice", (x) => ({ ...x, chain: ["t1", "t1"] }), /tag t1 twice/);
    await manifestCase(
      "missing",
      (x) => {
        delete x.files["snapshots/t1/vmstate"];
        return x;
      },
      /does not list snapshots\/t1\/vmstate/,
    );
    await manifestCase(
      "unknown",
      (x) => {
        x.files["snapshots/t9/memory"] = { size: 1, sha256: "0".repeat(64) };
        return x;
      },
      /unexpected path/,
    );
    await manifestCase(
      "hugemeta",
      (x) => {
        x.files["snapshots/t1/meta.json"] = { size: 1 << 30, sha256: "0".repeat(64) };
        return x;
      },
      /meta\.json is too large/,
    );

    const manifest = await readFile(join(dir, "manifest.json"));
    const dup = await forgePack(join(s.root, "dup.tar.zst"), [
      ["manifest.json", manifest.length, manifest],
      ["snapshots/t1/vmstate", 7, Buffer.from("devices")],
      ["snapshots/t1/vmstate", 7, Buffer.from("devices")],
    ]);
    await rejectsWith(unpack(s.deps, dup), "invalid_argument", /two entries for snapshots\/t1\/vmstate/);
    await rejectsWith(
      unpack(s.deps, await forgePack(join(s.root, "none.tar.zst"), [])),
      "invalid_argument",
      /no manifest/,
    );

    const cases: Array<[string, Buffer, RegExp]> = [
      ["not zstd", Buffer.from("this is not a pack at all, just text"), /not a readable pack/],
      ["truncated", bytes.subarray(0, bytes.length >> 1), /not a readable pack/],
      [
        "zstd of junk",
        await sh("sh", ["-c", "head -c 4096 /dev/urandom | zstd -q -c | base64 -w0"]).then((r) =>
          Buffer.from(r.stdout, "base64"),
        ),
        /not a readable pack/,
      ],
    ];
    for (const [what, body, re] of cases) {
      const f = join(s.root, "case.bin");
      await writeFile(f, body);
      await assert.rejects(unpack(s.deps, f), (e: unknown) => {
        assert.ok(e instanceof ForkdError && e.code === "invalid_argument", `${what}: ${String(e)}`);
        assert.match(e.message, re, what);
        assert.ok(!e.message.includes(s.root), `${what}: no host path in ${e.message}`);
        return true;
      });
    }
    await sh("ln", ["-s", "/etc/passwd", join(dir, "image", "evil")]);
    await rejectsWith(
      unpack(s.deps, await tarZst(dir, join(s.root, "link.tar.zst"))),
      "invalid_argument",
      /not a plain file/,
    );
    await rm(join(dir, "image", "evil"));
    await sh("ln", [join(dir, "image", "vmlinuz"), join(dir, "image", "initrd.img2")]);
    await rejectsWith(
      unpack(s.deps, await tarZst(dir, join(s.root, "hard.tar.zst"))),
      "invalid_argument",
      /not a plain file|unexpected pack entry/,
    );
    await rm(join(dir, "image", "initrd.img2"));
    await assertClean(s.deps);

    // A disk layer that would make QEMU write a host file of the pack's choosing.
    const disk = join(dir, "snapshots", "t1", "disk.qcow2");
    const savedDisk = await readFile(disk);
    await rm(disk);
    const target = join(s.root, "host-file");
    await sh("qemu-img", ["create", "-q", "-f", "qcow2", "-o", `data_file=${target}`, disk, "1M"]);
    await writeManifest(dir);
    await rejectsWith(
      unpack(s.deps, await tarZst(dir, join(s.root, "datafile.tar.zst"))),
      "invalid_argument",
      /disk\.qcow2 is not a usable disk layer: it names an external data file/,
    );
    await writeFile(disk, savedDisk);
    await writeManifest(dir);
    await assertClean(s.deps);

    // pax headers (GNU tar --format=posix) are read; pax sparse members and dumpdirs are not.
    const posix = join(s.root, "posix.tar.zst");
    await sh("tar", [
      "--zstd",
      "--format=posix",
      "-cf",
      posix,
      "-C",
      dir,
      "manifest.json",
      "image",
      "snapshots",
    ]);
    assert.deepEqual((await unpack(s.deps, posix, "posix")).published, ["posix"]);
    await s.deps.store.delete("posix");
    await rm(join(s.deps.cacheDir, "imported"), { recursive: true });
    const paxSparse = join(s.root, "paxsparse.tar.zst");
    await truncate(join(dir, "image", "rootfs.ext4"), 4 << 20);
    await sh("tar", ["--zstd", "--sparse", "--format=posix", "-cf", paxSparse, "-C", dir, "image"]);
    await truncate(join(dir, "image", "rootfs.ext4"), 1 << 20);
    await rejectsWith(unpack(s.deps, paxSparse), "invalid_argument", /pax sparse members are not supported/);
    const dumpdir = await forgePack(join(s.root, "dumpdir.tar.zst"), [["image", 512, 0x41, "5"]]);
    await rejectsWith(
      unpack(s.deps, dumpdir),
      "invalid_argument",
      /entry "image": a directory entry with data/,
    );
    const fifo = await forgePack(join(s.root, "fifo.tar.zst"), [["image/vmlinuz", 0, 0, "6"]]);
    await rejectsWith(unpack(s.deps, fifo), "invalid_argument", /not a plain file or directory/);
    await assertClean(s.deps);

    // And the untouched pack still unpacks.
    assert.deepEqual((await unpack(s.deps, good)).published, ["t1"]);
  } finally {
    await s.done();
  }
});

test("an image's content address is over every file, and a budget refuses before admitting", () => {
  const sum = (c: string, size = 1) => ({ size, sha256: c.repeat(64) });
  const files = {
    vmlinuz: sum("a"),
    "initrd.img": sum("b"),
    "rootfs.ext4": sum("c"),
    "manifest.json": sum("d"),
  };
  const a = imageAddress(files);
  assert.match(a, /^[0-9a-f]{64}$/);
  assert.equal(imageAddress({ ...files }), a);
  for (const k of Object.keys(files) as (keyof typeof files)[]) {
    assert.notEqual(imageAddress({ ...files, [k]: sum("e") }), a, `${k} counts`);
    assert.notEqual(imageAddress({ ...files, [k]: { ...files[k], size: 2 } }), a, `${k}'s size counts`);
  }
  assert.throws(() => imageAddress({ ...files, vmlinuz: { size: 1, sha256: "xyz" } }), /bad size or sha256/);

  assert.deepEqual(unpackLimit(100, 1000, 10), { bytes: 100, why: "limit" });
  assert.deepEqual(unpackLimit(null, 1000, 10), { bytes: 990, why: "space" });
  assert.deepEqual(unpackLimit(5000, 1000, 10), { bytes: 990, why: "space" });
  const b = new UnpackBudget({ bytes: 100, why: "limit" }, (p) => (p === "m" ? 10 : Infinity));
  b.admit("x", 40);
  assert.throws(() => b.admit("x", 1), /two entries for x/);
  assert.throws(
    () => b.admit("y", 61),
    (e: unknown) => e instanceof ForkdError && e.code === "payload_too_large",
  );
  assert.throws(() => b.admit("m", 11), /m is too large/);
  assert.throws(() => b.state({ x: { size: 41 } }, "m", 5), /x is 40 bytes; its manifest says 41/);
  const c = new UnpackBudget({ bytes: 100, why: "space" });
  assert.throws(
    () => c.state({ x: { size: 99 } }, "m", 5),
    (e: unknown) => e instanceof ForkdError && e.code === "resource_exhausted",
  );
  c.state({ x: { size: 40 } }, "m", 5);
  assert.throws(() => c.admit("z", 1), /does not list: z/);
  assert.throws(() => c.admit("x", 41), /x is 41 bytes; its manifest says 40/);
  c.admit("x", 40);
  c.admit("m", 5);
  assert.equal(c.bytes, 45);
});

test("an unpack reports its phases: verify, then register (with the structured phase field)", async () => {
  const s = await scratch();
  try {
    const dir = join(s.root, "p");
    await fakePack(dir);
    const file = await tarZst(dir, join(s.root, "p.tar.zst"));
    const lines: Array<{ message: string; phase?: string | undefined }> = [];
    const r = await unpackSnapshot(s.deps, createReadStream(file), {
      progress: (message, d) => lines.push({ message, phase: d?.phase }),
    });
    assert.deepEqual(r.published, ["t1"]);
    assert.deepEqual(
      lines.map((l) => l.phase),
      ["verify", "register"],
      JSON.stringify(lines),
    );
    assert.ok(lines.every((l) => l.message.length > 0));
  } finally {
    await s.done();
  }
});
