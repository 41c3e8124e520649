/**
 * The snapshot tree's layout: parent → child edges from each snapshot's parent tag (a snapshot
 * still being written hangs under the snapshot its source sandbox was forked from); each node at
 * its depth, leaves side by side in depth-first order, a parent centred over its children.
 */

export interface TreeInput {
  id: string;
  parent: string | null;
}

export interface PlacedNode {
  id: string;
  x: number;
  y: number;
  depth: number;
}

export interface Layout {
  nodes: PlacedNode[];
  edges: { from: string; to: string }[];
  width: number;
  height: number;
}

export function layoutTree(items: TreeInput[], dx: number, dy: number): Layout {
  const ids = new Set(items.map((i) => i.id));
  const children: Record<string, string[]> = {};
  const roots: string[] = [];
  for (const i of [...items].sort((a, b) => a.id.localeCompare(b.id))) {
    if (i.parent !== null && ids.has(i.parent) && i.parent !== i.id) (children[i.parent] ??= []).push(i.id);
    else roots.push(i.id);
  }
  const nodes: PlacedNode[] = [];
  const edges: { from: string; to: string }[] = [];
  const seen = new Set<string>();
  let nextLeaf = 0;
  let maxDepth = 0;
  const place = (id: string, depth: number): number => {
    seen.add(id);
    maxDepth = Math.max(maxDepth, depth);
    const xs: number[] = [];
    for (const c of children[id] ?? []) {
      if (seen.has(c)) continue;
      edges.push({ from: id, to: c });
      xs.push(place(c, depth + 1));
    }
    const col = xs.length === 0 ? nextLeaf++ : (Math.min(...xs) + Math.max(...xs)) / 2;
    nodes.push({ id, x: col, y: depth, depth });
    return col;
  };
  for (const r of roots) place(r, 0);
  // A cycle (a corrupt parent chain) must not hide nodes: what is left becomes a root.
  for (const i of items) if (!seen.has(i.id)) place(i.id, 0);
  return {
    nodes: nodes.map((n) => ({ ...n, x: n.x * dx + dx / 2, y: n.y * dy + dy / 2 })),
    edges,
    width: Math.max(1, nextLeaf) * dx,
    height: (maxDepth + 1) * dy,
  };
}
