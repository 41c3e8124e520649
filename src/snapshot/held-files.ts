/**
 * The files a peer may ask this node for by sha256 (GET /peer/v1/blobs/sha256:<hex>,
 * src/peer/): the own files of every snapshot it holds ready (chain-files.ts: memory or
 * memory.diff, vmstate, disk.qcow2 and meta.json) and the guest image files those snapshots
 * boot. Nothing else on the host is reachable by a sum: the lookup runs over this list only.
 *
 * Recorded sums are tried first (no hashing), then the metadata files, then the images (each
 * hashed once while unchanged: file-sums.ts).
 */
import { ForkdError } from "../util/index.js";
import { imageFiles, ownFiles } from "./chain-files.js";
import type { HeldFile } from "./chain-files.js";
import type { FileSums } from "./file-sums.js";
import type { SnapshotStore } from "./store.js";

const SHA_RE = /^[0-9a-f]{64}$/;

/** The file this node holds whose sha256 is `sha256` (not_found: none). */
export async function heldFile(store: SnapshotStore, sums: FileSums, sha256: string): Promise<HeldFile> {
  if (!SHA_RE.test(sha256)) throw new ForkdError("invalid_argument", "not a sha256");
  const metas = await store.list();
  const missing = () => new ForkdError("not_found", `no file with sha256 ${sha256} here`);
  for (const m of metas) {
    const own = m.files.memoryDiff
      ? [m.files.memoryDiff, m.files.vmstate, m.files.disk]
      : [m.files.memory, m.files.vmstate, m.files.disk];
    if (!own.some((f) => f.sha256 === sha256)) continue;
    for (const f of (await ownFiles(store, m, sums)).values()) if (f.sha256 === sha256) return f;
  }
  for (const m of metas) {
    const meta = (await ownFiles(store, m, sums)).get("meta.json");
    if (meta?.sha256 === sha256) return meta;
  }
  for (const dir of new Set(metas.map((m) => m.image.dir))) {
    const files = await imageFiles(dir, sums).catch(() => null);
    for (const f of files?.values() ?? []) if (f.sha256 === sha256) return f;
  }
  throw missing();
}
