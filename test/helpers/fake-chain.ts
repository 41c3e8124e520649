/**
 * Fake but complete snapshot chains on disk, without a VM: a scratch store with a guest image
 * (its build manifest, a sparse root filesystem), base snapshots with a full memory image and
 * diff branches (forkd-memsnap's diff format) over them, real qcow2 layers stacked as a branch's
 * are. For tests of chains, packs and pulls.
 */
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { sha256File, writeMeta } from "../../src/snapshot/meta.js";
import type { SnapshotMeta } from "../../src/snapshot/meta.js";
import { memoryDiffFile, SnapshotStore } from "../../src/snapshot/store.js";
import { fakeMeta } from "./snapshots.js";

const sh = promisify(execFile);

export const PSZ = 4096;
export const PAGES = 1024;

/** A forkd-memsnap diff (native/memsnap/forkd-memsnap.c's format) of `runs` {page, bytes}. */
export function diffOf(runs: Array<{ page: number; data: Buffer }>): Buffer {
  const head = Buffer.alloc(24);
  head.write("FKMDIFF1", 0, "latin1");
  head.writeBigUInt64LE(BigInt(PSZ), 8);
  head.writeBigUInt64LE(BigInt(PSZ * PAGES), 16);
  const parts = [head];
  for (const r of runs) {
    const rec = Buffer.alloc(16);
    rec.writeBigUInt64LE(BigInt(r.page * PSZ), 0);
    rec.writeBigUInt64LE(BigInt(r.data.length), 8);
    parts.push(rec, Buffer.from(r.data));
  }
  parts.push(Buffer.alloc(16));
  return Buffer.concat(parts);
}

export interface Scratch {
  root: string;
  store: SnapshotStore;
  imageDir: string;
  done: () => Promise<void>;
}

export async function scratch(prefix = "forkd-diffsnap-"): Promise<Scratch> {
  const root = await mkdtemp(join(tmpdir(), prefix));
  await mkdir(join(root, "snapshots"));
  const imageDir = join(root, "image");
  await mkdir(imageDir);
  await writeFile(join(imageDir, "vmlinuz"), "kernel");
  await writeFile(join(imageDir, "initrd.img"), "initrd");
  await writeFile(join(imageDir, "rootfs.ext4"), "");
  await truncate(join(imageDir, "rootfs.ext4"), 1 << 20);
  const sums: Record<string, unknown> = {};
  for (const f of ["vmlinuz", "initrd.img", "rootfs.ext4"]) sums[f] = await sha256File(join(imageDir, f));
  await writeFile(
    join(imageDir, "manifest.json"),
    JSON.stringify({
      format: 2,
      template: "python",
      kernel_version: "6",
      image_hash: "ab".repeat(32),
      files: sums,
    }),
  );
  return {
    root,
    store: new SnapshotStore(join(root, "snapshots")),
    imageDir,
    done: () => rm(root, { recursive: true, force: true }),
  };
}

export const qcow2 = (path: string, backing: string, fmt: "raw" | "qcow2") =>
  sh("qemu-img", ["create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", fmt, path, "1M"]);

/** A base snapshot with a full memory image `mem`, owned by `owner`. */
export async function baseSnapshot(
  s: Scratch,
  tag: string,
  mem: Buffer,
  owner: string | null = null,
): Promise<SnapshotMeta> {
  const f = s.store.filesFor(tag);
  await mkdir(f.dir);
  await writeFile(f.memory, mem);
  await writeFile(f.vmstate, `devices of ${tag}`);
  await qcow2(f.disk, join(s.imageDir, "rootfs.ext4"), "raw");
  await qcow2(f.childDisk, f.disk, "qcow2");
  return writeMeta(f.meta, {
    ...fakeMeta(tag, owner, {
      memory: await sha256File(f.memory),
      vmstate: await sha256File(f.vmstate),
      disk: await sha256File(f.disk),
    }),
    image: { hash: "ab".repeat(32), dir: s.imageDir, kernelVersion: "6" },
    parent: null,
  });
}

/** A diff branch of `parent` whose memory is `diff` over `base`'s image (what branch.ts writes). */
export async function diffSnapshot(
  s: Scratch,
  tag: string,
  parent: SnapshotMeta,
  base: SnapshotMeta,
  diff: Buffer,
  owner: string | null = null,
): Promise<SnapshotMeta> {
  const f = s.store.filesFor(tag);
  await mkdir(f.dir);
  await writeFile(memoryDiffFile(f.dir), diff);
  await writeFile(f.vmstate, `devices of ${tag}`);
  await qcow2(f.disk, s.store.filesFor(parent.tag).disk, "qcow2");
  await qcow2(f.childDisk, f.disk, "qcow2");
  return writeMeta(f.meta, {
    ...fakeMeta(tag, owner, {
      memory: base.files.memory,
      memoryDiff: await sha256File(memoryDiffFile(f.dir)),
      vmstate: await sha256File(f.vmstate),
      disk: await sha256File(f.disk),
    }),
    image: { hash: "ab".repeat(32), dir: s.imageDir, kernelVersion: "6" },
    parent: { tag: parent.tag, checksum: parent.checksum },
    memoryBase: { tag: base.tag, checksum: base.files.memory.sha256 },
  });
}
