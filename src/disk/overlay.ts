/**
 * Writable disks: qcow2 layers over a read-only base. A parent boots on its own layer over the
 * image's raw rootfs; after the snapshot that layer is frozen and every child gets a fresh empty
 * layer over it, so children never share a writable disk.
 */
import { chmod, copyFile, constants } from "node:fs";
import { promisify } from "node:util";
import { run } from "../util/proc.js";

const copy = promisify(copyFile);
const chmodP = promisify(chmod);

export interface OverlayOptions {
  backing: string;
  backingFormat: "raw" | "qcow2";
  /** Virtual size in bytes; required when the backing file is not opened (`unsafe`). */
  sizeBytes?: number;
  /** Do not open the backing file (it may not exist yet at its final path). */
  unsafe?: boolean;
}

export async function createOverlay(path: string, o: OverlayOptions): Promise<void> {
  const args = [
    "create",
    "-q",
    "-f",
    "qcow2",
    "-o",
    "lazy_refcounts=on",
    "-b",
    o.backing,
    "-F",
    o.backingFormat,
  ];
  if (o.unsafe) args.push("-u");
  args.push(path);
  if (o.sizeBytes !== undefined) args.push(String(o.sizeBytes));
  await run("qemu-img", args, { timeoutMs: 30_000 });
}

/**
 * A child's layer: a copy of the snapshot's pre-made empty layer (which already names the
 * snapshot's frozen layer as its backing file). Copying 200 KB costs far less than qemu-img.
 */
export async function cloneOverlay(template: string, dest: string): Promise<void> {
  await copy(template, dest, constants.COPYFILE_EXCL);
  await chmodP(dest, 0o600);
}

export async function virtualSize(path: string): Promise<number> {
  const { stdout } = await run("qemu-img", ["info", "-U", "--output=json", path], { timeoutMs: 30_000 });
  return (JSON.parse(stdout) as { "virtual-size": number })["virtual-size"];
}

/**
 * Writes `out`: the disk chain whose top layer is `top`, flattened into one qcow2 layer over
 * `base` (which must be somewhere below `top` in its chain). Reads images VMs may hold open
 * (`-U`); never modifies them.
 */
export async function flattenLayers(
  top: string,
  base: { path: string; format: "raw" | "qcow2" },
  out: string,
): Promise<void> {
  await run(
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
    { timeoutMs: 3_600_000 },
  );
}

/** Points a layer at a new backing file without reading it (the content must be the same). */
export async function rebaseUnsafe(layer: string, backing: string, format: "raw" | "qcow2"): Promise<void> {
  await run("qemu-img", ["rebase", "-u", "-b", backing, "-F", format, layer], { timeoutMs: 60_000 });
}
