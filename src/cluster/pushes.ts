/**
 * Pushes recorded in the cluster (records.ts PushRecord): a node that pushed a snapshot to an
 * OCI registry writes where (the reference and the manifest's digest) and which snapshots it
 * pushed (the cluster digest of each of the chain's keys as it held them); a node that must
 * fetch the snapshot when no live peer holds it (ensure.ts) pulls it from there, by that digest,
 * as long as the catalog still names the same snapshots by those keys. One record per key and
 * reference (a later push to the same reference replaces it); the records of a key go with its
 * catalog entry (deleting.ts).
 */
import { createHash } from "node:crypto";
import { ForkdError, errorMessage } from "../util/index.js";
import type { NodeContext } from "./context.js";
import { PushRecord, parseRecord } from "./records.js";

/** What a push tells the cluster: where it went, and whether plain http was allowed. */
export interface PushDone {
  ref: string;
  digest: string;
  insecure: boolean;
}

/** The id of reference `ref` in a key (a short hash: references have characters keys refuse). */
export const refId = (ref: string): string => createHash("sha256").update(ref).digest("hex").slice(0, 24);

/** The chain of `key` as the catalog names it (root first), or null when a link is missing. */
export function catalogChain(c: NodeContext, key: string): { key: string; digest: string }[] | null {
  const out: { key: string; digest: string }[] = [];
  for (let k: string | null = key; k !== null;) {
    const e = c.catalog.get(c.keys.catalogEntry(k));
    if (!e || out.length >= 64) return null;
    out.unshift({ key: k, digest: e.digest });
    k = e.parent;
  }
  return out;
}

/**
 * Records that this node pushed `key` (held here, its chain's digests as held here). Skipped,
 * said in the log, when some of the chain is held under no digest (the catalog would not
 * accept the copies) or the write fails: the push itself succeeded.
 */
export async function recordPush(
  c: NodeContext,
  key: string,
  chainKeys: string[],
  p: PushDone,
): Promise<void> {
  const chain = chainKeys.map((k) => ({ key: k, digest: c.held.get(k) }));
  if (chain.some((x) => x.digest === undefined)) {
    c.log.warn("cluster: a push not recorded: some of its chain is held under no digest", { tag: key });
    return;
  }
  const record = PushRecord.parse({
    key,
    ref: p.ref,
    digest: p.digest,
    insecure: p.insecure,
    chain,
    node: c.id,
    pushed: new Date().toISOString(),
  });
  try {
    await c.kv.put(c.keys.push(key, refId(p.ref)), JSON.stringify(record));
  } catch (e) {
    c.log.warn("cluster: a push not recorded", { tag: key, ref: p.ref, error: errorMessage(e) });
  }
}

/**
 * The recorded pushes of `key` a node may fetch it from now, newest first: those whose chain is
 * the catalog's (every key under the same digest).
 */
export async function usablePushes(c: NodeContext, key: string): Promise<PushRecord[]> {
  const want = catalogChain(c, key);
  if (!want) return [];
  // Every record of the key (a few: one per reference it was pushed to), newest first below.
  const { entries } = await c.kv.list(c.keys.pushesOf(key));
  const same = (r: PushRecord): boolean =>
    r.key === key &&
    r.chain.length === want.length &&
    r.chain.every((x, i) => x.key === want[i]?.key && x.digest === want[i]?.digest);
  return entries
    .map((e) => parseRecord(PushRecord, e.value))
    .filter((r): r is PushRecord => r !== null && same(r))
    .sort((a, b) => (a.pushed < b.pushed ? 1 : a.pushed > b.pushed ? -1 : 0));
}

/** The error a fetch reports when neither a peer nor a registry gave the snapshot. */
export function fetchFailed(key: string, peer: unknown, registry: string[]): ForkdError {
  const code = peer instanceof ForkdError ? peer.code : "unavailable";
  const tail = registry.length > 0 ? `; from its registry pushes: ${registry.join("; ")}` : "";
  return new ForkdError(code, `${errorMessage(peer)}${tail}`, { tag: key });
}
