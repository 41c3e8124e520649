/** The snapshots page: the tree of snapshots and branches, and the selected node's panel. */
import { SnapshotGraph } from "../components/snapshot-graph";
import { SnapshotPanel } from "../components/snapshot-panel";
import type { LiveState } from "../lib/live-state";
import { hrefOf } from "../lib/route";

export function SnapshotsPage({ live, tag }: { live: LiveState; tag: string | undefined }) {
  const select = (t: string) => {
    location.hash = hrefOf({ page: "snapshots", tag: t });
  };
  const selected = tag ? live.snapshots[tag] : undefined;
  const count = Object.keys(live.snapshots).length;
  return (
    <section aria-labelledby="snapshots-h">
      <h1 id="snapshots-h">Snapshots</h1>
      <p class="count">{count} snapshots</p>
      <p class="legend">
        Solid lines: a branch's disk parent. <span class="memory">Dashed lines</span>: the memory base a diff
        snapshot maps, when it is not the parent.
      </p>
      <div class="tree-layout">
        <div class="tree-wrap">
          <SnapshotGraph
            snapshots={live.snapshots}
            sandboxes={live.sandboxes}
            selected={tag}
            onSelect={select}
          />
        </div>
        {selected ? (
          <SnapshotPanel
            key={selected.tag}
            s={selected}
            sandboxes={Object.values(live.sandboxes).filter((x) => x.tag === selected.tag)}
            onDeleted={() => (location.hash = hrefOf({ page: "snapshots" }))}
          />
        ) : (
          <p class="panel">
            {tag ? `Snapshot ${tag} is not there (any more).` : "Select a snapshot in the tree."}
          </p>
        )}
      </div>
    </section>
  );
}
