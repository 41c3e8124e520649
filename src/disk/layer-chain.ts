/**
 * The files of a disk chain, for a host tool that reads it jailed (src/vmm/jailed-tools.ts sees
 * only the files it is given): from the top layer down through the backing file each qcow2
 * header names (read without qemu-img: src/cache/qcow2-backing.ts) to the first file that is not
 * a qcow2 layer (a guest image's raw root filesystem). A layer's header is what a guest's VMM or
 * a tenant's pack wrote, so every file must lie in one of the directories the caller names:
 * a chain naming a host file elsewhere is refused, never handed to the tool.
 */
import { resolve, sep } from "node:path";
import { qcow2Backing } from "../cache/index.js";
import { ForkdError } from "../util/index.js";

/** The deepest chain followed (a snapshot chain of branches is far shorter). */
const MAX_DEPTH = 1000;

const inside = (p: string, dir: string): boolean => {
  const d = resolve(dir);
  return p === d || p.startsWith(d.endsWith(sep) ? d : d + sep);
};

/** `top` and every file below it, top first; each within one of `within` (files or directories). */
export async function layerChain(top: string, within: string[]): Promise<string[]> {
  const files: string[] = [];
  for (let p: string | null = resolve(top); p !== null; p = await qcow2Backing(p)) {
    if (files.includes(p) || files.length >= MAX_DEPTH)
      throw new ForkdError("snapshot_corrupt", `the disk chain under ${top} loops or is too deep`);
    if (!within.some((d) => inside(p, d)))
      throw new ForkdError(
        "snapshot_corrupt",
        `a disk layer of ${top} names a backing file outside its chain: ${p}`,
      );
    files.push(p);
  }
  return files;
}
