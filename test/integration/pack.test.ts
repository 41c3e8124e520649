/**
 * Packs with real VMs: a chain is packed on one daemon and unpacked into another with an empty
 * data directory and an empty image cache, then forked there. Tampered and path-escaping
 * archives are refused and leave nothing behind.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { api, forkOne, sh } from "../helpers/vm.js";
import { cli, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { steps } from "../helpers/steps.js";

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
  ]) {
    assert.ok(stdout.split("\n").includes(f), `${f} in the pack`);
  }
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
  // Unpacking the same pack again finds everything already there.
  const again = await cli(b, ["unpack", pack()]);
  assert.equal(again.code, 0, again.stderr);
  assert.match(again.stdout, /registered: nothing new/);
});

async function repack(
  name: string,
  edit: (dir: string) => Promise<void>,
  tarArgs: string[] = [],
): Promise<string> {
  const dir = join(work, `${name}-dir`);
  await mkdir(dir);
  await sh$("tar", ["--zstd", "-xf", pack(), "-C", dir]);
  await edit(dir);
  const out = join(work, `${name}.tar.zst`);
  await sh$("tar", ["--zstd", "-cf", out, "-C", dir, ...tarArgs, "."]);
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
  // Where `../escape.txt` would land if extracted in the unpack's staging directory.
  await assert.rejects(stat(join(b.dataDir, "snapshots", "escape.txt")), "nothing was written outside");
});
