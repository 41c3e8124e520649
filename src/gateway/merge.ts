/**
 * How the gateway makes one answer of many nodes' (pure; docs/cluster.md, "Gateway"):
 *
 * - a page of a listing: every node is asked for the same page (the same cursor and limit: a
 *   cursor names a place in one order all nodes share, the creation time and id of the last
 *   item), the items are merged in that order and cut at the limit. Each node's page holds all
 *   its items that can be among the merged page's, so the merged page is the page a single
 *   listing of every node would give; there are more when the merge was cut or a node had more.
 * - a fork: each node's ForkResult (or its failure as a whole) becomes part of one result whose
 *   failure indexes are the caller's (a node's children are numbered from its part's offset).
 */

export interface NodePage<T> {
  items: T[];
  /** The node said it has more past this page. */
  more: boolean;
}

/** Merges `pages` by `key` (ascending, or descending), cut at `limit` (undefined: none). */
export function mergePages<T>(
  pages: readonly NodePage<T>[],
  key: (item: T) => string,
  limit: number | undefined,
  order: "asc" | "desc" = "asc",
): { items: T[]; more: boolean } {
  const sign = order === "asc" ? 1 : -1;
  const seen = new Set<string>();
  const all: T[] = [];
  for (const p of pages)
    for (const it of p.items) {
      const k = key(it);
      if (seen.has(k)) continue;
      seen.add(k);
      all.push(it);
    }
  all.sort((a, b) => {
    const x = key(a);
    const y = key(b);
    return (x < y ? -1 : x > y ? 1 : 0) * sign;
  });
  const cut = limit !== undefined && all.length > limit;
  const items = cut ? all.slice(0, limit) : all;
  return { items, more: cut || pages.some((p) => p.more) };
}

/** One child's failure, numbered as the caller counts its children. */
export interface ChildFailure {
  index: number;
  code: string;
  message: string;
}

/** What one node's part of a fork gave. */
export type PartOutcome =
  | { ok: true; sandboxes: unknown[]; failures: ChildFailure[] }
  /** The node failed the part as a whole (its children's failures carry its code and reason). */
  | { ok: false; code: string; message: string; failures?: ChildFailure[] };

export interface ForkPart {
  node: string;
  /** The caller's index of this part's first child. */
  offset: number;
  count: number;
  outcome: PartOutcome;
}

export interface MergedFork {
  sandboxes: unknown[];
  failures: ChildFailure[];
}

/**
 * One ForkResult of the parts, in the caller's order. A part that failed as a whole fails each
 * of its children with its code, the message naming the node (or with the node's own per-child
 * failures when it gave them: every child failed there); `extra` are failures of children no
 * node took.
 */
export function mergeFork(parts: readonly ForkPart[], extra: readonly ChildFailure[] = []): MergedFork {
  const sandboxes: unknown[] = [];
  const failures: ChildFailure[] = [];
  for (const p of [...parts].sort((a, b) => a.offset - b.offset)) {
    const o = p.outcome;
    if (o.ok) {
      sandboxes.push(...o.sandboxes);
      for (const f of o.failures) failures.push(renumber(p, f));
      continue;
    }
    const own = (o.failures ?? []).filter((f) => f.index >= 0 && f.index < p.count);
    if (own.length === p.count) {
      for (const f of own) failures.push(renumber(p, f));
      continue;
    }
    for (let i = 0; i < p.count; i++)
      failures.push({ index: p.offset + i, code: o.code, message: `node ${p.node}: ${o.message}` });
  }
  failures.push(...extra);
  failures.sort((a, b) => a.index - b.index);
  return { sandboxes, failures };
}

const renumber = (p: ForkPart, f: ChildFailure): ChildFailure => ({
  index: p.offset + f.index,
  code: f.code,
  message: f.message.startsWith(`node ${p.node}: `) ? f.message : `node ${p.node}: ${f.message}`,
});
