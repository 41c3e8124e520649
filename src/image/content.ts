/**
 * Guest images by content: the address of an image is computed from its files (kernel, initrd,
 * root filesystem and its manifest.json), never taken from what anyone says about it.
 *
 *   <cache>/images/<build-hash>/   written only by guest/image/build.sh, which marks each with a
 *                                  `provenance` record and trusts no image without one
 *   <cache>/imported/<address>/    images installed from packs (unpack, pull), verified first
 *   <cache>/dockerfile/images/<address>/  images built from Dockerfiles (image/dockerfile/install.ts)
 *
 * A pack's image is installed under its content address, so it can never satisfy the builder's
 * lookup by build hash; an image this host already has with the same content (built or
 * imported) is reused instead. See docs/snapshot-format.md, "Guest images".
 */
import { createHash } from "node:crypto";
import { readdir, readFile } from "node:fs/promises";
import { basename, join } from "node:path";
import { z } from "zod";
import { ForkdError } from "../util/index.js";
import { exists } from "../util/index.js";

/** The files of an image directory (its manifest.json marks it complete). */
export const IMAGE_FILES = ["vmlinuz", "initrd.img", "rootfs.ext4", "manifest.json"] as const;
export type ImageFile = (typeof IMAGE_FILES)[number];

export interface FileSum {
  size: number;
  sha256: string;
}

const SHA_RE = /^[0-9a-f]{64}$/;
const ADDRESS_FORMAT = "forkd-image-content/1";

/** The content address of an image with these files (their sizes and sha256). */
export function imageAddress(files: Record<ImageFile, FileSum>): string {
  const h = createHash("sha256").update(`${ADDRESS_FORMAT}\n`);
  for (const f of [...IMAGE_FILES].sort()) {
    const s = files[f];
    if (!Number.isSafeInteger(s.size) || s.size < 0 || !SHA_RE.test(s.sha256)) {
      throw new ForkdError("invalid_argument", `image file ${f}: bad size or sha256`);
    }
    h.update(`${f} ${s.size} ${s.sha256}\n`);
  }
  return h.digest("hex");
}

export const isAddress = (s: string): boolean => SHA_RE.test(s);

/** Where an image installed from a pack lives. */
export const importedDir = (cacheDir: string, address: string): string => {
  if (!isAddress(address)) throw new ForkdError("invalid_argument", "bad image address");
  return join(cacheDir, "imported", address);
};

const BuiltManifest = z.object({
  image_hash: z.string().regex(SHA_RE),
  files: z.object({
    vmlinuz: z.object({ sha256: z.string().regex(SHA_RE), size: z.number().int().nonnegative() }),
    "initrd.img": z.object({ sha256: z.string().regex(SHA_RE), size: z.number().int().nonnegative() }),
    "rootfs.ext4": z.object({ sha256: z.string().regex(SHA_RE), size: z.number().int().nonnegative() }),
  }),
});

/** The four files' sums an image's manifest.json records (with its own), and its image hash. */
async function recorded(
  dir: string,
): Promise<{ sums: Record<ImageFile, FileSum>; imageHash: string } | null> {
  try {
    const raw = await readFile(join(dir, "manifest.json"));
    if (raw.length > 1 << 20) return null;
    const m = BuiltManifest.parse(JSON.parse(raw.toString("utf8")));
    return {
      imageHash: m.image_hash,
      sums: {
        ...m.files,
        "manifest.json": { size: raw.length, sha256: createHash("sha256").update(raw).digest("hex") },
      },
    };
  } catch {
    return null;
  }
}

/** Whether `dir` holds the builder's provenance record naming `imageHash`. */
const builtWith = async (dir: string, imageHash: string): Promise<boolean> =>
  readFile(join(dir, "provenance"), "utf8").then(
    (prov) => prov.split("\n").includes(`image_hash=${imageHash}`),
    () => false,
  );

/**
 * The content address of an image the builder made (`dir` holds its provenance record naming
 * the hash in its manifest), from the sums the builder recorded while building and the
 * manifest's own hash; null for anything else (an image of unknown origin is never reused).
 */
export async function builtImageAddress(dir: string): Promise<string | null> {
  const r = await recorded(dir);
  if (!r || !(await builtWith(dir, r.imageHash))) return null;
  return imageAddress(r.sums);
}

/**
 * The sums of the four files of image directory `dir` as its manifest.json records them, when
 * they are to be believed: an image the builder made (its provenance record), or one named by
 * its content address (imported, or built from a Dockerfile) whose recorded sums make that very
 * address (so they are the sums its files were verified against, or written with). Null
 * otherwise: whoever needs the sums hashes the files.
 */
export async function recordedImageSums(dir: string): Promise<Record<ImageFile, FileSum> | null> {
  const r = await recorded(dir);
  if (!r) return null;
  if (imageAddress(r.sums) === basename(dir) || (await builtWith(dir, r.imageHash))) return r.sums;
  return null;
}

/**
 * An image directory of this host whose files are exactly `address`: an imported one, or one
 * the builder made with the same content; null if there is none.
 */
export async function findImage(cacheDir: string, address: string): Promise<string | null> {
  const imported = importedDir(cacheDir, address);
  if (await exists(join(imported, "manifest.json"))) return imported;
  const fromDockerfile = join(cacheDir, "dockerfile", "images", address);
  if (await exists(join(fromDockerfile, "manifest.json"))) return fromDockerfile;
  const built = join(cacheDir, "images");
  for (const name of await readdir(built).catch(() => [] as string[])) {
    if (!SHA_RE.test(name)) continue;
    if ((await builtImageAddress(join(built, name))) === address) return join(built, name);
  }
  return null;
}
