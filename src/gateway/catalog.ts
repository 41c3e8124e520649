/**
 * Snapshots as the cluster's catalog holds them, for one caller: the key a tag it names reads (the
 * same namespace rules as a daemon's store: src/snapshot/namespace.ts, over catalog/ instead of a
 * directory), the catalog entries it is shown, and an entry's view named for it (the view a node
 * wrote is an admin's: tags are store keys). Which node serves a snapshot's own calls: a holder,
 * its origin first.
 */
import type { Caller } from "../access/index.js";
import { noSnapshot, tagNames, viewerOf } from "../app/index.js";
import type { CatalogEntry, NodeRecord } from "../cluster/index.js";
import { Namespaces, shownTo } from "../snapshot/index.js";
import type { Gateway } from "./context.js";

export function catalogNamespaces(g: Gateway): Namespaces {
  return new Namespaces(
    {
      lookup: async (key) => {
        const e = g.view.catalogEntry(key);
        return e ? { owner: e.owner, status: "ready" } : undefined;
      },
    },
    g.reserved,
  );
}

/** The catalog entry `tag` reads for `caller` (404 as a daemon answers: it does not exist for it). */
export async function entryFor(g: Gateway, caller: Caller, tag: string): Promise<CatalogEntry> {
  const key = await catalogNamespaces(g).find(viewerOf(caller), tag);
  const e = key === null ? undefined : g.view.catalogEntry(key);
  if (!e) throw noSnapshot(tag);
  return e;
}

/** The catalog entries `caller` is shown. */
export function entriesFor(g: Gateway, caller: Caller): CatalogEntry[] {
  return shownTo(
    viewerOf(caller),
    g.view.catalogEntries(),
    (e) => e.key,
    (e) => e.owner,
  ).sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

const rename = (v: unknown, names: (k: string) => string): unknown => {
  if (typeof v !== "object" || v === null) return v;
  const o = v as Record<string, unknown>;
  return typeof o.tag === "string" ? { ...o, tag: names(o.tag) } : o;
};

/** Entry `e`'s Snapshot view as `caller` is shown it (its tags in the caller's namespace). */
export function entryView(e: CatalogEntry, caller: Caller): Record<string, unknown> {
  const names = tagNames(caller);
  const v: Record<string, unknown> = { ...e.view, tag: names(e.key) };
  if ("parent" in v) v.parent = rename(v.parent, names);
  if ("memory_base" in v) v.memory_base = rename(v.memory_base, names);
  return v;
}

/** The nodes in the cluster that hold `key`, its origin first, then the warmest. */
export function holdersOf(g: Gateway, e: CatalogEntry): NodeRecord[] {
  const nodes = g.view
    .holders(e.key)
    .filter((h) => g.view.node(h.node) !== undefined)
    .sort((a, b) => (a.node === e.origin ? -1 : b.node === e.origin ? 1 : b.warm - a.warm));
  return nodes.map((h) => g.view.node(h.node)).filter((n): n is NodeRecord => n !== undefined);
}
