/**
 * Writable disks: qcow2 layers over a read-only base. A parent boots on its own layer over the
 * image's raw rootfs; after the snapshot that layer is frozen and every child gets a fresh empty
 * layer over it, so children never share a writable disk.
 *
 * Layers are written by guests' VMMs (and packs by tenants): every qemu-img that parses one runs
 * jailed (src/vmm/jailed-tools.ts). Only `qemu-img create -u` runs as the daemon: it reads no
 * file (the backing file is named in the new header, never opened) and writes a new one.
 */
import { chmod, copyFile, constants, stat } from "node:fs";
import { promisify } from "node:util";
import { run } from "../util/index.js";
import { runTool } from "../vmm/index.js";
import type { ToolRunner } from "../vmm/index.js";
import { layerChain } from "./layer-chain.js";

const copy = promisify(copyFile);
const chmodP = promisify(chmod);
const statP = promisify(stat);

export interface OverlayOptions {
  backing: string;
  backingFormat: "raw" | "qcow2";
  /** Virtual size in bytes (the backing file is not opened: it may not exist yet at its path). */
  sizeBytes: number;
}

/** A new empty layer over `backing` (trusted: see the header; not jailed). */
export async function createOverlay(path: string, o: OverlayOptions): Promise<void> {
  const args = ["create", "-q", "-f", "qcow2", "-o", "lazy_refcounts=on"];
  args.push("-b", o.backing, "-F", o.backingFormat, "-u", path, String(o.sizeBytes));
  await run("qemu-img", args, { timeoutMs: 30_000 });
}

/** The size of a raw disk image (a guest image's rootfs): its virtual size. */
export const rawSize = async (path: string): Promise<number> => (await statP(path)).size;

/**
 * A child's layer: a copy of the snapshot's pre-made empty layer (which already names the
 * snapshot's frozen layer as its backing file). Copying 200 KB costs far less than qemu-img.
 */
export async function cloneOverlay(template: string, dest: string): Promise<void> {
  await copy(template, dest, constants.COPYFILE_EXCL);
  await chmodP(dest, 0o600);
}

/**
 * Writes `out` (which must not exist): the disk chain whose top layer is `top`, flattened into
 * one qcow2 layer over `base` (which must be somewhere below `top` in its chain). Reads images
 * VMs may hold open (`-U`); never modifies them. Jailed: the tool sees the chain's files (each in
 * one of `within`: layer-chain.ts) and `out`, and may write no more than the chain's virtual
 * size (its raw bottom's) and qcow2's own metadata. `out` is left mode 0600, the daemon's.
 */
export async function flattenLayers(
  tools: ToolRunner,
  top: string,
  base: { path: string; format: "raw" | "qcow2" },
  out: string,
  within: string[],
): Promise<void> {
  const chain = await layerChain(top, within);
  const size = await rawSize(chain[chain.length - 1] ?? top);
  await runTool(
    tools,
    "qemu-img",
    [
      "convert",
      "-U",
      "-q",
      "-O",
      "qcow2",
      "-o",
      "lazy_refcounts=on",
      "-B",
      base.path,
      "-F",
      base.format,
      top,
      out,
    ],
    {
      reads: chain,
      creates: [out],
      timeoutMs: 3_600_000,
      maxFileBytes: size + Math.ceil(size / 64) + (64 << 20),
    },
  );
}

/**
 * Writes `out` (which must not exist): the whole chain under `top` as one raw image, jailed as
 * flattenLayers is; its size is the chain's bottom's (a guest image's rootfs). Left mode 0600.
 */
export async function convertToRaw(
  tools: ToolRunner,
  top: string,
  out: string,
  within: string[],
): Promise<void> {
  const chain = await layerChain(top, within);
  await runTool(tools, "qemu-img", ["convert", "-U", "-q", "-O", "raw", top, out], {
    reads: chain,
    creates: [out],
    timeoutMs: 3_600_000,
    maxFileBytes: await rawSize(chain[chain.length - 1] ?? top),
  });
}

/**
 * Points a layer at a new backing file without reading it (the content must be the same). The
 * layer's header is parsed and rewritten: jailed, the tool sees the layer alone (-u opens no
 * backing file) and may grow it by little; the layer is the daemon's again after, mode `mode`.
 */
export async function rebaseUnsafe(
  tools: ToolRunner,
  layer: string,
  backing: string,
  format: "raw" | "qcow2",
  mode = 0o644,
): Promise<void> {
  await runTool(tools, "qemu-img", ["rebase", "-u", "-b", backing, "-F", format, layer], {
    writes: [layer],
    mode,
    timeoutMs: 60_000,
    maxFileBytes: (await statP(layer)).size + (16 << 20),
  });
}
