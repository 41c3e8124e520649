/**
 * The node's snapshots against the catalog, at each join: a snapshot held under a digest the
 * catalog no longer has (deleted, or replaced, while the node was away) is removed
 * (removals.ts); one not catalogued yet (made before the node joined a cluster, or in another
 * one) is catalogued, create-only, as made here; one whose tag the catalog has with another
 * digest is kept but not offered (logged). A catalog entry this node made that it no longer has
 * and no live node holds (a crash between the entry and the publication) is removed.
 */
import { errorMessage } from "../util/index.js";
import type { CatalogGuard } from "./catalog.js";
import type { NodeContext } from "./context.js";
import type { Holder } from "./ensure.js";
import type { Removals } from "./removals.js";

export async function syncSnapshots(
  c: NodeContext,
  catalog: CatalogGuard,
  removals: Removals,
  holders: (key: string) => Promise<Holder[]>,
): Promise<void> {
  const metas = await c.store.list();
  const here = new Set(metas.map((m) => m.tag));
  const parent = new Map(metas.map((m) => [m.tag, m.parent?.tag ?? null]));
  const depth = (t: string): number => {
    let d = 0;
    for (let p = parent.get(t); p && d < 1000; p = parent.get(p)) d++;
    return d;
  };
  let catalogued = 0;
  // Parents first: a branch's digest names its parent's.
  for (const m of [...metas].sort((a, b) => depth(a.tag) - depth(b.tag))) {
    const held = c.held.get(m.tag);
    const e = catalog.entry(m.tag);
    if (held !== undefined) {
      if (e?.digest !== held) removals.add(m.tag);
      continue;
    }
    try {
      const digest = await catalog.digestOf(m);
      if (e) {
        if (e.digest === digest) c.held.set(m.tag, digest);
        else
          c.log.warn("cluster: a snapshot here differs from the cluster's of its tag; not offered", {
            tag: m.tag,
            node: e.origin,
          });
        continue;
      }
      const r = await catalog.createOnly(
        m.tag,
        JSON.stringify(await catalog.entryOf(m, digest)),
        `snapshot ${m.tag}`,
      );
      if (r === "conflict") {
        c.log.warn("cluster: another node catalogued this tag meanwhile; not offered", { tag: m.tag });
        continue;
      }
      c.held.set(m.tag, digest);
      catalogued++;
    } catch (err) {
      c.log.warn("cluster: a snapshot here not catalogued", { tag: m.tag, error: errorMessage(err) });
      if (c.member.lease === null) throw err;
    }
  }
  for (const k of c.held.keys()) if (!here.has(k)) c.held.delete(k);
  await c.held.save();
  let orphans = 0;
  for (const e of [...c.catalog.values()]) {
    if (e.origin !== c.id || here.has(e.key) || catalog.publishingNow(e.key)) continue;
    if ((await holders(e.key)).length > 0) continue;
    const key = c.keys.catalogEntry(e.key);
    const cur = await c.kv.get(key);
    if (!cur) continue;
    await c.kv.txn([{ key, target: "mod", op: "==", value: cur.modRevision }], [{ type: "delete", key }]);
    orphans++;
  }
  if (catalogued > 0 || orphans > 0 || removals.size > 0)
    c.log.info("cluster: snapshots synced with the catalog", {
      catalogued,
      orphans_removed: orphans,
      to_remove: removals.size,
    });
}
