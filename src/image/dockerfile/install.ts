/**
 * A finished build's disk chain installed as a guest image: flattened to one raw ext4
 * (`qemu-img convert`), its journal replayed and checked (`e2fsck`, fsck.ts: a fix beyond what a
 * mounted ext4 leaves behind fails the build), both jailed (src/vmm/jailed-tools.ts: the chain is
 * what the build VM wrote, the tools see its files alone), the base image's kernel and
 * initramfs beside it, a manifest.json, all under `<cache>/dockerfile/images/<address>/` where
 * the address is the image's content address (image/content.ts), renamed into place complete.
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { chmod, mkdir, open, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fsyncDir } from "../../util/index.js";
import { exists, linkOrCopy } from "../../util/index.js";
import { convertToRaw } from "../../disk/index.js";
import type { ToolRunner } from "../../vmm/index.js";
import type { GuestImage } from "../builder.js";
import { imageAddress } from "../content.js";
import type { FileSum } from "../content.js";
import { checkBuiltFilesystem } from "./fsck.js";

const sum = (path: string): Promise<FileSum> =>
  new Promise((resolve, reject) => {
    const h = createHash("sha256");
    let size = 0;
    createReadStream(path)
      .on("data", (d) => {
        h.update(d);
        size += d.length;
      })
      .on("error", reject)
      .on("end", () => resolve({ size, sha256: h.digest("hex") }));
  });

export interface InstallRequest {
  /** The top layer of the final step (its chain reaches the base rootfs). */
  top: string;
  base: GuestImage;
  /** The final step's key, recorded as the image's build hash. */
  key: string;
  /** A working directory of this build. */
  work: string;
  imagesDir: string;
  /** Recorded in manifest.json. */
  extra: Record<string, unknown>;
  /** Runs qemu-img and e2fsck jailed. */
  tools: ToolRunner;
  /** Where the chain's layers may be (the step cache's layers, `work`): layer-chain.ts. */
  within: string[];
}

/** Returns the installed image's content address. */
export async function installImage(r: InstallRequest): Promise<string> {
  const dir = join(r.work, "image");
  await mkdir(dir, { mode: 0o755 });
  const rootfs = join(dir, "rootfs.ext4");
  await convertToRaw(r.tools, r.top, rootfs, [...r.within, r.work, r.base.rootfs]);
  await checkBuiltFilesystem(r.tools, rootfs);
  await linkOrCopy(r.base.kernel, join(dir, "vmlinuz"));
  await linkOrCopy(r.base.initrd, join(dir, "initrd.img"));
  const [vmlinuz, initrd, fs] = await Promise.all([
    sum(join(dir, "vmlinuz")),
    sum(join(dir, "initrd.img")),
    sum(rootfs),
  ]);
  const manifest = Buffer.from(
    JSON.stringify(
      {
        image_hash: r.key,
        template: r.base.template,
        kernel_version: r.base.kernelVersion,
        kind: "dockerfile",
        base: { hash: r.base.hash, content: r.base.content },
        files: { vmlinuz, "initrd.img": initrd, "rootfs.ext4": fs },
        rootfs_size_mib: Math.ceil((await stat(rootfs)).size / (1 << 20)),
        ...r.extra,
      },
      null,
      2,
    ) + "\n",
  );
  await writeFile(join(dir, "manifest.json"), manifest, { mode: 0o444 });
  const address = imageAddress({
    vmlinuz,
    "initrd.img": initrd,
    "rootfs.ext4": fs,
    "manifest.json": { size: manifest.length, sha256: createHash("sha256").update(manifest).digest("hex") },
  });
  await chmod(rootfs, 0o444);
  // On disk before the directory is renamed into place: a crash never leaves an image trusted half-written.
  for (const f of ["vmlinuz", "initrd.img", "rootfs.ext4", "manifest.json"]) {
    const fh = await open(join(dir, f), "r");
    await fh.sync().finally(() => fh.close());
  }
  await mkdir(r.imagesDir, { recursive: true, mode: 0o700 });
  const dest = join(r.imagesDir, address);
  if (await exists(join(dest, "manifest.json"))) return address; // the same image, built before
  await rm(dest, { recursive: true, force: true });
  await rename(dir, dest);
  await fsyncDir(r.imagesDir);
  return address;
}
