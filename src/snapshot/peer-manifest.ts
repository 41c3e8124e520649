/**
 * The peer manifest: what a node that holds a snapshot tells a peer pulling it (GET
 * /peer/v1/snapshots/<key>/manifest, src/peer/): its chain root first under the store keys this
 * node holds them by (a tenant's `alice/app` stays `alice/app`), their owners, the guest image,
 * and every file's size and sha256 as this node has them (meta.json as it is, disk layers with
 * this node's backing paths). The same shape as a pack's manifest (pack.ts), with keys for tags:
 *
 *   {"format": "forkd-peer/1", "created", "tag": KEY, "chain": [root key, ..., KEY],
 *    "owners": [owner or null, ...], "image": {"hash", "template", "kernelVersion"},
 *    "files": {"image/<f>": {size, sha256}, "snapshots/<key dir>/<f>": {size, sha256}, ...}}
 *
 * `<key dir>` is the key as the store names its directory (`alice~app`). Files are listed by
 * chain-files.ts, the one listing packs use too.
 */
import { z } from "zod";
import { ForkdError } from "../util/index.js";
import { isValidKey } from "../util/index.js";
import { listChain } from "./chain-files.js";
import type { FileSums } from "./file-sums.js";
import { PackManifestSchema, checkChainShape, parseManifestJson, stagedDir } from "./pack.js";
import type { SnapshotMeta } from "./meta.js";
import type { SnapshotStore } from "./store.js";

export const PEER_FORMAT = "forkd-peer/1";

export const PeerManifestSchema = PackManifestSchema.extend({
  format: z.literal(PEER_FORMAT),
  owners: z.array(z.string().max(256).nullable()).min(1).max(64),
});
export type PeerManifest = z.infer<typeof PeerManifestSchema>;

/**
 * Parses a peer's manifest (at most 16 MiB) and checks its shape as a pack's (checkChainShape,
 * with store keys for tags) and one owner per snapshot (each as its meta.json records it, which
 * registration checks: an admin's branch in a tenant's namespace may be owned by no tenant).
 */
export function parsePeerManifest(raw: string): PeerManifest {
  const m = parseManifestJson(raw, PeerManifestSchema, "peer manifest");
  checkChainShape(m, isValidKey, "peer manifest");
  if (m.owners.length !== m.chain.length)
    throw new ForkdError("invalid_argument", "peer manifest: one owner per snapshot of its chain", {
      field: "owners",
    });
  return m;
}

/** `key`'s peer manifest, from this node's store (not_found when it does not hold `key` ready). */
export async function peerManifest(store: SnapshotStore, key: string, sums: FileSums): Promise<PeerManifest> {
  const { chain, image, own } = await listChain(store, key, sums);
  const root = chain[0] as SnapshotMeta;
  const files: PeerManifest["files"] = {};
  for (const [f, h] of image) files[`image/${f}`] = { size: h.size, sha256: h.sha256 };
  for (const [i, m] of chain.entries()) {
    for (const [f, h] of own[i] ?? []) files[`${stagedDir(m.tag)}/${f}`] = { size: h.size, sha256: h.sha256 };
  }
  return {
    format: PEER_FORMAT,
    created: new Date().toISOString(),
    tag: key,
    chain: chain.map((m) => m.tag),
    owners: chain.map((m) => m.owner ?? null),
    image: { hash: root.image.hash, template: root.template, kernelVersion: root.image.kernelVersion },
    files,
  };
}
