/**
 * A delete through the API, cluster-wide (called by the snapshot service once its local checks
 * passed, before anything changes): refused (409, naming them) while any sandbox anywhere
 * (sandboxes/ running or paused) runs from what would go, or while branches other nodes made
 * stack on it (neither cascade nor force); else the entries leave the catalog in one
 * transaction (with cascade, its whole subtree; with force, its direct branches no longer name
 * it as their parent), and every node removes its copy once no sandbox of its own uses it
 * (removals.ts).
 */
import type { KvOp } from "../etcd/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import type { NodeContext } from "./context.js";
import { chunkGroups } from "./fence.js";
import { SandboxLocation, parseRecord } from "./records.js";
import type { CatalogEntry } from "./records.js";

export async function deleteInCluster(
  c: NodeContext,
  tag: string,
  o: { cascade: boolean; force: boolean },
  local: string[],
): Promise<string[]> {
  if (!c.catalog.live)
    throw new ForkdError("unavailable", "the cluster's catalog is not followed right now; try again shortly");
  const all = new Map<string, CatalogEntry>();
  for (const e of c.catalog.values()) all.set(e.key, e);
  if (!all.has(tag) && local.length === 0)
    throw new ForkdError("not_found", `no snapshot tagged ${tag}`, { tag });
  const children = (t: string) => [...all.values()].filter((e) => e.parent === t).map((e) => e.key);
  const going = new Set(local);
  if (all.has(tag)) going.add(tag);
  if (o.cascade) {
    const stack = [tag];
    for (let t = stack.pop(); t !== undefined; t = stack.pop()) {
      for (const k of children(t)) {
        if (going.has(k)) continue;
        going.add(k);
        stack.push(k);
      }
    }
  }
  const others = children(tag).filter((k) => !going.has(k));
  if (!o.cascade && !o.force && others.length > 0)
    throw new ForkdError(
      "conflict",
      `snapshot ${tag} has dependents (branches stacked on it): ${others.join(", ")}; delete them first`,
      { tag, dependents: others },
    );
  const users = await sandboxesOf(c, going);
  if (users.length > 0) {
    const ids = users.map((u) => `${u.id} (${u.tag} on ${u.node})`);
    throw new ForkdError(
      "conflict",
      `snapshot ${tag} is in use in the cluster: ${users.length} running or paused sandboxes run from ` +
        `it or what goes with it: ${ids.slice(0, 20).join(", ")}${ids.length > 20 ? ", ..." : ""}; kill them first`,
      { tag, sandboxes: users.map((u) => u.id) },
    );
  }
  const gone = [...going].filter((k) => all.has(k));
  // Its recorded pushes go with it (a registry's copy is no longer the cluster's to fetch).
  const groups: KvOp[][] = gone.map((k) => [
    { type: "delete", key: c.keys.catalogEntry(k) },
    { type: "delete", key: c.keys.pushesOf(k), prefix: true },
  ]);
  // Forced: its branches stay, no longer stacked on it (each node flattens its copies: removals.ts).
  if (o.force)
    for (const k of others) {
      const e = all.get(k);
      if (e)
        groups.push([
          { type: "put", key: c.keys.catalogEntry(k), value: JSON.stringify({ ...e, parent: null }) },
        ]);
    }
  try {
    for (const ops of chunkGroups(groups)) await c.kv.txn([], ops);
  } catch (e) {
    throw new ForkdError("unavailable", `snapshot ${tag} not deleted from the cluster: ${errorMessage(e)}`, {
      tag,
    });
  }
  return gone;
}

/** Sandboxes anywhere in the cluster running or paused from one of `tags`. */
async function sandboxesOf(c: NodeContext, tags: Set<string>): Promise<SandboxLocation[]> {
  const { entries } = await c.kv.list(c.keys.sandboxes);
  const out: SandboxLocation[] = [];
  for (const e of entries) {
    const l = parseRecord(SandboxLocation, e.value);
    if (l && (l.state === "running" || l.state === "paused") && tags.has(l.tag)) out.push(l);
  }
  return out;
}
