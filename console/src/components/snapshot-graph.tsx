/**
 * The snapshot tree as an SVG graph: parent → child edges (solid), a diff snapshot's memory base
 * → it (dashed, when the base is not its parent), each node a focusable button with its status
 * and the sandboxes running from it; arrow keys move between nodes, Enter selects.
 */
import type { Sandbox, SnapshotView } from "../api/types";
import { memoryBaseOf, parentOf } from "../lib/snapshot-parent";
import { layoutTree } from "../lib/tree-layout";

const DX = 170;
const DY = 90;

export function SnapshotGraph(p: {
  snapshots: Record<string, SnapshotView>;
  sandboxes: Record<string, Sandbox>;
  selected: string | undefined;
  onSelect: (tag: string) => void;
}) {
  const items = Object.values(p.snapshots).map((s) => ({ id: s.tag, parent: parentOf(s, p.sandboxes) }));
  const layout = layoutTree(items, DX, DY);
  const pos = Object.fromEntries(layout.nodes.map((n) => [n.id, n]));
  const memoryEdges = Object.values(p.snapshots).flatMap((s) => {
    const base = memoryBaseOf(s);
    return base !== null && pos[base] && pos[s.tag] ? [{ from: base, to: s.tag }] : [];
  });
  const running: Record<string, number> = {};
  for (const s of Object.values(p.sandboxes))
    if (s.state !== "exited") running[s.tag] = (running[s.tag] ?? 0) + 1;
  const order = [...layout.nodes].sort((a, b) => a.y - b.y || a.x - b.x).map((n) => n.id);
  const move = (from: string, key: string) => {
    const i = order.indexOf(from);
    const next = key === "ArrowRight" || key === "ArrowDown" ? order[i + 1] : order[i - 1];
    if (next) document.getElementById(`node-${next}`)?.focus();
  };
  return (
    <svg
      class="tree"
      role="group"
      aria-label="Snapshot tree"
      width={layout.width}
      height={layout.height}
      viewBox={`0 0 ${layout.width} ${layout.height}`}
    >
      {layout.edges.map((e) => {
        const a = pos[e.from];
        const b = pos[e.to];
        if (!a || !b) return null;
        return (
          <path
            key={`${e.from}->${e.to}`}
            class="edge"
            d={`M${a.x},${a.y + 22} C${a.x},${(a.y + b.y) / 2} ${b.x},${(a.y + b.y) / 2} ${b.x},${b.y - 22}`}
          />
        );
      })}
      {memoryEdges.map((e) => {
        const a = pos[e.from];
        const b = pos[e.to];
        if (!a || !b) return null;
        // From the base's side to the node's side, so it does not lie on a parent edge.
        const ax = a.x + (b.x >= a.x ? 75 : -75);
        const bx = b.x + (b.x >= a.x ? -75 : 75);
        return (
          <path
            key={`mem:${e.from}->${e.to}`}
            class="edge memory"
            d={`M${ax},${a.y} C${(ax + bx) / 2},${a.y} ${(ax + bx) / 2},${b.y} ${bx},${b.y}`}
          >
            <title>{`${e.to} maps the memory of ${e.from}`}</title>
          </path>
        );
      })}
      {layout.nodes.map((n) => {
        const s = p.snapshots[n.id];
        if (!s) return null;
        const count = running[n.id] ?? 0;
        const label = `Snapshot ${n.id}, ${s.status}, ${count} sandboxes`;
        return (
          <g
            key={n.id}
            id={`node-${n.id}`}
            class={`node ${s.status}${p.selected === n.id ? " selected" : ""}`}
            role="button"
            tabIndex={0}
            aria-label={label}
            aria-pressed={p.selected === n.id}
            transform={`translate(${n.x},${n.y})`}
            onClick={() => p.onSelect(n.id)}
            onKeyDown={(e) => {
              if (e.key === "Enter" || e.key === " ") {
                e.preventDefault();
                p.onSelect(n.id);
              } else if (e.key.startsWith("Arrow")) {
                e.preventDefault();
                move(n.id, e.key);
              }
            }}
          >
            <title>{label}</title>
            <rect x={-75} y={-22} width={150} height={44} rx={6} />
            <text y={-4} text-anchor="middle">
              {n.id.length > 20 ? `${n.id.slice(0, 19)}…` : n.id}
            </text>
            <text y={14} text-anchor="middle" class="sub">
              {s.status} · {count} running
            </text>
          </g>
        );
      })}
    </svg>
  );
}
