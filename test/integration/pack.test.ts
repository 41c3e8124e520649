/**
 * Packs with real VMs: a chain is packed on one daemon and unpacked into another with an empty
 * data directory and an empty image cache, then forked there. Tampered and path-escaping
 * archives are refused and leave nothing behind; a pack with a planted root filesystem under the
 * real image hash never becomes the image a later snapshot boots; a tiny archive that expands to
 * gigabytes is refused before it writes them; invalid metadata is a 400. The packs' disk layers
 * (a tenant wrote them) are read by qemu-img jailed, never as the daemon.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { promisify } from "node:util";
import { api, forkOne, sh } from "../helpers/vm.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { steps } from "../helpers/steps.js";
import { forgePack } from "../helpers/forge-pack.js";
import { peakGrowth } from "../helpers/disk-usage.js";
import { sha256File } from "../../src/snapshot/meta.js";
import { daemonToolRuns } from "../helpers/prometheus.js";

const sh$ = promisify(execFile);
const { step, failed } = steps();
let a: TestDaemon;
let b: TestDaemon;
let work: string;
const pack = () => join(work, "p2.forkd.tar.zst");

before(async () => {
  work = await mkdtemp(join(tmpdir(), "forkd-pack-"));
  a = await makeDaemon({ FORKD_POOL_SIZE: "0" });
  // The target host: nothing of ours, not even the guest image.
  b = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_CACHE_DIR: join(work, "cache-b") });
});

after(async () => {
  await a.destroy(failed());
  await b.destroy(failed());
  await rm(work, { recursive: true, force: true });
});

/** b's snapshots and leftovers: nothing may remain after a refused unpack. */
async function bState(): Promise<{ tags: string[]; staging: string[] }> {
  const tags = (await api<{ snapshots: { tag: string }[] }>(b, "GET", "/v1/snapshots")).snapshots.map(
    (s) => s.tag,
  );
  const staging = (await readdir(join(b.dataDir, "snapshots"))).filter((n) => n.startsWith("."));
  return { tags, staging };
}

step("a chain of two branches is packed with the CLI", async () => {
  await api(a, "POST", "/v1/snapshots", { tag: "pbase", memory_mib: 256, warm_eval: "packed = 'yes'" });
  let tag = "pbase";
  for (const n of [1, 2]) {
    const id = await forkOne(a, tag);
    await sh(a, id, `echo layer${n} >> /root/layers.txt`);
    await api(a, "POST", `/v1/sandboxes/${id}/branch`, { tag: `p${n}` });
    await api(a, "DELETE", `/v1/sandboxes/${id}`);
    tag = `p${n}`;
  }
  const r = await cli(a, ["pack", "p2", "-o", pack()]);
  assert.equal(r.code, 0, r.stderr);
  assert.ok((await stat(pack())).size > 1 << 20);
  const { stdout } = await sh$("tar", ["--zstd", "-tf", pack()]);
  for (const f of [
    "./manifest.json",
    "./image/rootfs.ext4",
    "./snapshots/pbase/memory",
    "./snapshots/p2/disk.qcow2",
    "./snapshots/p1/memory.diff",
    "./snapshots/p2/memory.diff",
  ]) {
    assert.ok(stdout.split("\n").includes(f), `${f} in the pack`);
  }
  // The branches carry their diffs, not a full RAM image each.
  assert.ok(!stdout.split("\n").includes("./snapshots/p2/memory"), "no full image of a branch");
});

step("unpacked into an empty data dir and image cache, the chain forks with its state", async () => {
  const r = await cli(b, ["unpack", pack()]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /p2 ready \(registered: pbase, p1, p2\)/);
  const info = await api<{ depth: number; ancestors: string[] }>(b, "GET", "/v1/snapshots/p2/info");
  assert.deepEqual([info.depth, info.ancestors], [2, ["p1", "pbase"]]);
  const id = await forkOne(b, "p2");
  assert.equal(await sh(b, id, "cat /root/layers.txt"), "layer1\nlayer2\n");
  const v = await api<{ value: string }>(b, "POST", `/v1/sandboxes/${id}/eval`, { code: "packed" });
  assert.equal(v.value, "'yes'");
  await api(b, "DELETE", `/v1/sandboxes/${id}`);
  const p2 = await api<{ memory_base?: { tag: string }; files: { memory_diff?: { size: number } } }>(
    b,
    "GET",
    "/v1/snapshots/p2",
  );
  assert.equal(p2.memory_base?.tag, "pbase", "a diff over the root's image, as packed");
  assert.ok((p2.files.memory_diff?.size ?? 0) > 0);
  // Unpacking the same pack again finds everything already there.
  const again = await cli(b, ["unpack", pack()]);
  assert.equal(again.code, 0, again.stderr);
  assert.match(again.stdout, /registered: nothing new/);
});

/**
 * The pack's contents, extracted once for all the repacks below (each copies it: a copy of the
 * files is cheaper than decompressing the pack again).
 */
let extracted: Promise<string> | null = null;
function extractedPack(): Promise<string> {
  return (extracted ??= (async () => {
    const dir = join(work, "extracted");
    await mkdir(dir);
    await sh$("tar", ["--zstd", "-xf", pack(), "-C", dir]);
    return dir;
  })());
}

/**
 * The pack, edited. Compressed at zstd's fastest level on every core: the unpack reads any zstd
 * stream alike, and the default level would spend most of this file's time compressing.
 */
async function repack(
  name: string,
  edit: (dir: string) => Promise<void>,
  tarArgs: string[] = [],
): Promise<string> {
  const dir = join(work, `${name}-dir`);
  await sh$("cp", ["-a", "--sparse=always", await extractedPack(), dir]);
  await edit(dir);
  const out = join(work, `${name}.tar.zst`);
  await sh$("tar", ["-I", "zstd -1 -T0", "-cf", out, "-C", dir, ...tarArgs, "."]);
  await rm(dir, { recursive: true, force: true });
  return out;
}

step("a tampered or path-escaping pack is refused and leaves nothing behind", async () => {
  for (const t of ["p2", "p1", "pbase"]) await api(b, "DELETE", `/v1/snapshots/${t}`);
  const before = await bState();
  const cases: Array<[string, string, RegExp]> = [
    [
      "flipped byte",
      await repack("tampered", async (d) => {
        const f = join(d, "snapshots", "p1", "vmstate");
        const { stdout } = await sh$("sh", [
          "-c",
          `printf 'X' | dd of=${f} bs=1 seek=100 conv=notrunc 2>/dev/null; echo ok`,
        ]);
        assert.equal(stdout.trim(), "ok");
      }),
      /does not match its checksum/,
    ],
    [
      "extra file",
      await repack("extra", async (d) => writeFile(join(d, "snapshots", "p1", "evil.sh"), "x")),
      /unexpected pack entry/,
    ],
    [
      "symlink",
      await repack("link", async (d) => {
        await sh$("ln", ["-s", "/etc/shadow", join(d, "image", "evil")]);
      }),
      /not a plain file/,
    ],
    [
      // A disk layer that is not one: the jailed qemu-img says so (counted below).
      "not a qcow2 layer",
      await repack("notqcow2", async (d) => {
        const disk = join(d, "snapshots", "pbase", "disk.qcow2");
        await writeFile(disk, "not a disk\n");
        const m = JSON.parse(await readFile(join(d, "manifest.json"), "utf8")) as {
          files: Record<string, { size: number; sha256: string }>;
        };
        m.files["snapshots/pbase/disk.qcow2"] = await sha256File(disk);
        await writeFile(join(d, "manifest.json"), JSON.stringify(m));
      }),
      /not a usable disk layer: .*qemu-img info .*failed/,
    ],
    [
      "path escape",
      await repack("escape", async (d) => writeFile(join(d, "escape.txt"), "x"), [
        "-P",
        "--transform",
        "s,^\\./escape.txt,../escape.txt,",
      ]),
      /escapes the pack/,
    ],
  ];
  for (const [what, file, want] of cases) {
    const r = await cli(b, ["unpack", file]);
    assert.notEqual(r.code, 0, `${what}: refused`);
    assert.match(r.stderr, want, `${what}: ${r.stderr}`);
    assert.deepEqual(await bState(), before, `${what}: nothing left behind`);
  }
  // Every qemu-img b ran (this layer's, the unpack before) ran jailed.
  const runs = await daemonToolRuns(b.ep);
  assert.ok((runs.jailed["qemu-img"] ?? 0) >= 3, JSON.stringify(runs));
  assert.deepEqual(runs.unjailed, {});
  // Where `../escape.txt` would land if extracted in the unpack's staging directory.
  await assert.rejects(stat(join(b.dataDir, "snapshots", "escape.txt")), "nothing was written outside");
});

interface SnapshotView {
  image: { hash: string; dir: string };
}

step(
  "a pack with a planted root filesystem under the real image hash is never what a later snapshot boots",
  async () => {
    // The real image of a's snapshots (which the poisoned pack claims to be).
    const real = (await api<SnapshotView>(a, "GET", "/v1/snapshots/pbase")).image;
    const realRootfs = await sha256File(join(real.dir, "rootfs.ext4"));
    let planted = "";
    const poisoned = await repack(
      "poisoned",
      async (d) => {
        const rootfs = join(d, "image", "rootfs.ext4");
        await writeFile(join(work, "planted.txt"), "planted\n");
        await sh$("debugfs", ["-w", "-R", `write ${join(work, "planted.txt")} planted.txt`, rootfs]);
        const m = JSON.parse(await readFile(join(d, "manifest.json"), "utf8")) as {
          image: { hash: string };
          files: Record<string, { size: number; sha256: string }>;
        };
        assert.equal(m.image.hash, real.hash);
        const sum = await sha256File(rootfs);
        m.files["image/rootfs.ext4"] = sum;
        planted = sum.sha256;
        assert.notEqual(planted, realRootfs.sha256);
        await writeFile(join(d, "manifest.json"), JSON.stringify(m));
      },
      ["--sparse"],
    );
    // A host that has the image builder's stages (hard links to a's cache: nothing it has rebuilt) but
    // not the image itself, as the host of the report had.
    const cacheC = join(work, "cache-c");
    const stagesOfA = join(dirname(dirname(real.dir)), "stages");
    await mkdir(cacheC);
    await sh$("cp", ["-al", stagesOfA, join(cacheC, "stages")]);
    const c = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_CACHE_DIR: cacheC });
    try {
      const r = await cli(c, ["unpack", poisoned]);
      assert.equal(r.code, 0, r.stderr);
      // Installed as what it is: the tenant's own snapshot boots the pack's image.
      const unpacked = (await api<SnapshotView>(c, "GET", "/v1/snapshots/p2")).image;
      assert.equal((await sha256File(join(unpacked.dir, "rootfs.ext4"))).sha256, planted);
      // An admin's fresh snapshot on that host: the builder's own image, without the planted file.
      await api(c, "POST", "/v1/snapshots", { tag: "fresh", memory_mib: 256 });
      const fresh = (await api<SnapshotView>(c, "GET", "/v1/snapshots/fresh")).image;
      assert.equal(fresh.hash, real.hash, "the same build");
      assert.notEqual(fresh.dir, unpacked.dir);
      const freshRootfs = (await sha256File(join(fresh.dir, "rootfs.ext4"))).sha256;
      assert.notEqual(freshRootfs, planted, "never the pack's planted root filesystem");
      // With a's final stage at hand (a cache collection may have removed it: then c made its
      // own ext4, the same tree in another file), c's image is a's, byte for byte.
      const provenance = await readFile(join(real.dir, "provenance"), "utf8");
      const finalStage = /\b(final-[0-9a-f]{64})\b/.exec(provenance)?.[1];
      const hadFinal =
        finalStage !== undefined &&
        (await stat(join(stagesOfA, finalStage)).then(
          () => true,
          () => false,
        ));
      if (hadFinal) assert.equal(freshRootfs, realRootfs.sha256);
      const id = await forkOne(c, "fresh");
      assert.equal(await sh(c, id, "test -e /planted.txt && echo planted || echo clean"), "clean\n");
      await api(c, "DELETE", `/v1/sandboxes/${id}`);
    } finally {
      await c.destroy(failed());
    }
  },
);

step(
  "a tiny archive that expands past its manifest is refused before it writes; invalid metadata is a 400",
  async () => {
    const before = await bState();
    const { stdout } = await sh$("tar", ["--zstd", "-xOf", pack(), "./manifest.json"], {
      maxBuffer: 1 << 26,
    });
    const raw = Buffer.from(stdout);
    const stated = (JSON.parse(stdout) as { files: Record<string, { size: number }> }).files[
      "snapshots/pbase/memory"
    ]?.size;
    const big = 2 ** 31; // 2 GiB of 'A' (not zeros: no hole would save the disk)
    const bombs = [
      await forgePack(join(work, "bomb-first.tar.zst"), [
        ["manifest.json", raw.length, raw],
        ["snapshots/pbase/memory", big, 0x41],
      ]),
      // The manifest last, as packs made before had it.
      await forgePack(join(work, "bomb-last.tar.zst"), [
        ["snapshots/pbase/memory", big, 0x41],
        ["manifest.json", raw.length, raw],
      ]),
    ];
    const watched = [b.dataDir, join(work, "cache-b")];
    for (const bomb of bombs) {
      assert.ok((await stat(bomb)).size < 1 << 20, "a small archive");
      const { result, grownKiB } = await peakGrowth(watched, () => cli(b, ["unpack", bomb]));
      assert.ok(grownKiB < 16 << 10, `${bomb}: at most 16 MiB written, not ${grownKiB} KiB`);
      assert.equal(result.status, "fulfilled");
      const r = result.status === "fulfilled" ? result.value : { code: -1, stderr: "" };
      assert.equal(r.code, 2, r.stderr);
      assert.match(r.stderr, new RegExp(`memory is ${big} bytes; its manifest says ${stated}`));
      assert.deepEqual(await bState(), before, `${bomb}: nothing left behind`);
    }

    // meta.json with a field of the wrong kind, the manifest's sums made to match.
    const badMeta = await repack("badmeta", async (d) => {
      const f = join(d, "snapshots", "pbase", "meta.json");
      const meta = JSON.parse(await readFile(f, "utf8")) as { machine: { accel: string } };
      meta.machine.accel = "arm";
      await writeFile(f, JSON.stringify(meta));
      const m = JSON.parse(await readFile(join(d, "manifest.json"), "utf8")) as {
        files: Record<string, { size: number; sha256: string }>;
      };
      m.files["snapshots/pbase/meta.json"] = await sha256File(f);
      await writeFile(join(d, "manifest.json"), JSON.stringify(m));
    });
    const r = await cli(b, ["unpack", badMeta]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /snapshots\/pbase\/meta\.json is invalid: machine\.accel/);
    assert.deepEqual(await bState(), before, "bad metadata: nothing left behind");
  },
);
