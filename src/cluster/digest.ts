/**
 * A snapshot's digest in the cluster: the name of its content whatever node holds it, computed
 * once by the node that made it and carried by the catalog (records.ts CatalogEntry). sha256 of
 * `forkd-snapshot-digest/1`, its parent's digest (or "-"), its guest image's content address
 * (src/image/content.ts) and its own files' sizes and sums (memory or memory.diff, vmstate,
 * disk layer), one line each. A node that pulled a snapshot holds it under the digest it pulled
 * (its disk layer's sum changes when rebased onto its paths; the content does not).
 */
import { createHash } from "node:crypto";
import type { SnapshotMeta } from "../snapshot/index.js";

export interface DigestInput {
  parentDigest: string | null;
  imageContent: string;
  files: Record<string, { size: number; sha256: string }>;
}

export function snapshotDigest(d: DigestInput): string {
  const h = createHash("sha256");
  h.update("forkd-snapshot-digest/1\n");
  h.update(`parent ${d.parentDigest ?? "-"}\n`);
  h.update(`image ${d.imageContent}\n`);
  for (const name of Object.keys(d.files).sort()) {
    const f = d.files[name];
    if (f) h.update(`${name} ${f.size} ${f.sha256}\n`);
  }
  return h.digest("hex");
}

/**
 * The digest input of a snapshot from its metadata: its own files (a diff snapshot's diff, not
 * the base image it maps), its image's content address (of an image made before content
 * addresses: its build hash, a label), and its parent's digest.
 */
export function metaDigestInput(meta: SnapshotMeta, parentDigest: string | null): DigestInput {
  const f = meta.files;
  return {
    parentDigest,
    imageContent: meta.image.content ?? `build:${meta.image.hash}`,
    files: f.memoryDiff
      ? { "memory.diff": f.memoryDiff, vmstate: f.vmstate, disk: f.disk }
      : { memory: f.memory, vmstate: f.vmstate, disk: f.disk },
  };
}
