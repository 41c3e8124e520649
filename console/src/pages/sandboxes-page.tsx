/** The sandboxes page: the live list with its filters and actions (and each one's node, in a cluster). */
import { useState } from "preact/hooks";
import { SandboxFilters } from "../components/sandbox-filters";
import { SandboxRow } from "../components/sandbox-row";
import { StatusLine } from "../components/status-line";
import { anyNode } from "../lib/cluster-nodes";
import type { LiveState } from "../lib/live-state";
import { matches, NO_FILTER } from "../lib/sandbox-filter";
import { useAction } from "../lib/use-action";
import { useNow } from "../lib/use-now";

export function SandboxesPage({ live }: { live: LiveState }) {
  const [filter, setFilter] = useState(NO_FILTER);
  const action = useAction();
  const now = useNow();
  const all = Object.values(live.sandboxes).sort((a, b) => b.created.localeCompare(a.created));
  const shown = all.filter((s) => matches(s, filter));
  const tags = [...new Set(all.map((s) => s.tag))].sort();
  const showNode = anyNode(all);
  const nodes = [...new Set(all.flatMap((s) => (s.node === null ? [] : [s.node])))].sort();
  return (
    <section aria-labelledby="sandboxes-h">
      <h1 id="sandboxes-h">Sandboxes</h1>
      <SandboxFilters filter={filter} snapshots={tags} nodes={nodes} onChange={setFilter} />
      <StatusLine action={action} />
      <p class="count">
        {shown.length} of {all.length} sandboxes
      </p>
      <div class="table-wrap">
        <table class="cards" aria-label="Sandboxes">
          <thead>
            <tr>
              <th scope="col">Sandbox</th>
              <th scope="col">State</th>
              <th scope="col">Snapshot</th>
              {showNode && <th scope="col">Node</th>}
              <th scope="col">Age</th>
              <th scope="col">CPU</th>
              <th scope="col">Memory</th>
              <th scope="col">Network</th>
              <th scope="col">Limits</th>
              <th scope="col">Exit reason</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {shown.map((s) => (
              <SandboxRow
                key={s.id}
                s={s}
                usage={live.usage[s.id]}
                now={now}
                action={action}
                showNode={showNode}
              />
            ))}
          </tbody>
        </table>
      </div>
      {all.length === 0 && <p>No sandboxes. Fork one from a snapshot on the Snapshots page.</p>}
    </section>
  );
}
