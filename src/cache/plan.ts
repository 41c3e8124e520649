/**
 * The collector's decision, a pure function of what is on disk: which entries stay (and why),
 * and which go, least recently used first, until the cache fits its budget (no budget: every
 * entry nothing keeps). An entry goes with every entry stacked on it (a Dockerfile step layer on
 * its base image, a later step on an earlier one), so nothing left behind names a deleted path.
 * Bytes are counted per inode: what deleting a set frees is the blocks of the files none of
 * whose links is left.
 */
import type { CacheEntry } from "./entries.js";
import type { Reason } from "./references.js";

export interface PlanInput {
  entries: CacheEntry[];
  /** Why entries are referenced (snapshots, pins, open files): by entry id. */
  references: Array<[string, Reason]>;
  /** Each entry's dependencies (references.ts backingEdges). */
  deps: Map<string, Set<string>>;
  /** Entries used more recently than this many ms ago stay. */
  graceMs: number;
  /** Evict only until the cache holds at most this many bytes; null: evict all that may go. */
  budgetBytes: number | null;
  now: number;
}

export interface PlannedEntry {
  id: string;
  kind: CacheEntry["kind"];
  /** The blocks of its files (those it shares with another entry included). */
  bytes: number;
  lastUse: number;
  reasons: Reason[];
}

export interface Plan {
  totalBytes: number;
  /** What the cache holds after the evictions. */
  afterBytes: number;
  kept: PlannedEntry[];
  /** In the order they go. */
  evict: PlannedEntry[];
}

export function planCollection(i: PlanInput): Plan {
  const byId = new Map(i.entries.map((e) => [e.id, e]));
  const reasons = new Map<string, Reason[]>();
  const add = (id: string, r: Reason) => {
    if (!byId.has(id)) return;
    const list = reasons.get(id) ?? [];
    if (list.some((x) => JSON.stringify(x) === JSON.stringify(r))) return; // named twice (meta and disk)
    list.push(r);
    reasons.set(id, list);
  };
  for (const [id, r] of i.references) add(id, r);
  for (const e of i.entries) {
    const age = i.now - e.lastUse;
    if (age < i.graceMs) add(e.id, { why: "recent", ageS: Math.max(0, Math.round(age / 1000)) });
  }
  // What a kept entry stands on stays too (transitively).
  const kept = new Set<string>();
  const keep = (id: string) => {
    const stack = [id];
    while (stack.length > 0) {
      const x = stack.pop() as string;
      if (kept.has(x)) continue;
      kept.add(x);
      for (const d of i.deps.get(x) ?? []) {
        if (!byId.has(d)) continue;
        if (!kept.has(d)) add(d, { why: "backing", of: x });
        stack.push(d);
      }
    }
  };
  for (const id of [...reasons.keys()]) keep(id);

  // Dependents: who stands on whom (to evict an entry with everything stacked on it).
  const dependents = new Map<string, string[]>();
  for (const [id, ds] of i.deps) for (const d of ds) dependents.set(d, [...(dependents.get(d) ?? []), id]);

  // Inodes: blocks, links inside entries, links left.
  const blocks = new Map<string, number>();
  const left = new Map<string, number>();
  const outside = new Set<string>();
  for (const e of i.entries) {
    for (const f of e.files) {
      blocks.set(f.inode, f.bytes);
      left.set(f.inode, (left.get(f.inode) ?? 0) + 1);
    }
  }
  for (const e of i.entries) {
    for (const f of e.files) if (f.nlink > (left.get(f.inode) ?? 0) && f.nlink > 1) outside.add(f.inode);
  }
  let total = 0;
  for (const b of blocks.values()) total += b;
  const entryBytes = (e: CacheEntry) => {
    const seen = new Set<string>();
    let n = 0;
    for (const f of e.files) {
      if (seen.has(f.inode)) continue;
      seen.add(f.inode);
      n += f.bytes;
    }
    return n;
  };
  const view = (e: CacheEntry): PlannedEntry => ({
    id: e.id,
    kind: e.kind,
    bytes: entryBytes(e),
    lastUse: e.lastUse,
    reasons: reasons.get(e.id) ?? [],
  });

  let now = total;
  const gone = new Set<string>();
  const evict: PlannedEntry[] = [];
  const remove = (e: CacheEntry) => {
    gone.add(e.id);
    evict.push(view(e));
    for (const f of e.files) {
      const l = (left.get(f.inode) ?? 1) - 1;
      left.set(f.inode, l);
      if (l === 0 && !outside.has(f.inode)) now -= blocks.get(f.inode) ?? 0;
    }
  };
  const candidates = i.entries
    .filter((e) => !kept.has(e.id))
    .sort((a, b) => a.lastUse - b.lastUse || (a.id < b.id ? -1 : 1));
  for (const c of candidates) {
    if (i.budgetBytes !== null && now <= i.budgetBytes) break;
    if (gone.has(c.id)) continue;
    // The entry and everything stacked on it (none of which is kept: keeping is transitive).
    const unit: CacheEntry[] = [];
    const stack = [c.id];
    while (stack.length > 0) {
      const x = stack.pop() as string;
      const e = byId.get(x);
      if (!e || gone.has(x) || unit.includes(e)) continue;
      unit.push(e);
      stack.push(...(dependents.get(x) ?? []));
    }
    // Dependents first: a layer goes before what it is backed by.
    for (const e of unit.reverse()) remove(e);
  }
  return {
    totalBytes: total,
    afterBytes: now,
    kept: i.entries.filter((e) => !gone.has(e.id)).map(view),
    evict,
  };
}
