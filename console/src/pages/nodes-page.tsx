/**
 * The nodes page (a cluster gateway's, admins): every node of the cluster as its record says,
 * refreshed every 5 s. On a daemon (alone, or a node: its 404 says which), or for a tenant, it
 * says why there is nothing to list.
 */
import { loadNodes } from "../api/nodes";
import type { ClusterNode } from "../api/types";
import { NodeRow } from "../components/node-row";
import { clusterTotals } from "../lib/cluster-nodes";
import { useNow } from "../lib/use-now";
import { usePoll } from "../lib/use-poll";

const EVERY_MS = 5000;

export function NodesPage() {
  const answer = usePoll(loadNodes, EVERY_MS, "nodes");
  const now = useNow();
  const a = answer.value;
  return (
    <section aria-labelledby="nodes-h">
      <h1 id="nodes-h">Nodes</h1>
      {answer.error && <p class="status error">{answer.error}</p>}
      {a === undefined && !answer.error && <p>Loading…</p>}
      {a?.kind === "alone" && <p>No nodes to list here: {a.message}.</p>}
      {a?.kind === "forbidden" && <p>Only admin callers see the cluster's nodes.</p>}
      {a?.kind === "nodes" && <NodesTable nodes={a.nodes} now={now} />}
    </section>
  );
}

function NodesTable({ nodes, now }: { nodes: ClusterNode[]; now: number }) {
  const t = clusterTotals(nodes);
  return (
    <>
      <p class="count">
        {t.nodes} {t.nodes === 1 ? "node" : "nodes"}
        {t.draining > 0 ? ` (${t.draining} draining)` : ""}: {t.running} running, {t.paused} paused, {t.free}{" "}
        free slots, {t.cores} cores
      </p>
      <div class="table-wrap">
        <table class="cards" aria-label="Nodes">
          <thead>
            <tr>
              <th scope="col">Node</th>
              <th scope="col">State</th>
              <th scope="col">Address</th>
              <th scope="col">Machine</th>
              <th scope="col">Cores</th>
              <th scope="col">Memory</th>
              <th scope="col">Sandboxes</th>
              <th scope="col">Free slots</th>
              <th scope="col">Snapshots held</th>
              <th scope="col">Version</th>
              <th scope="col">Up</th>
            </tr>
          </thead>
          <tbody>
            {nodes.map((n) => (
              <NodeRow key={n.id} n={n} now={now} />
            ))}
          </tbody>
        </table>
      </div>
      {nodes.length === 0 && (
        <p>No node is in the cluster now: every node's lease has expired or none joined.</p>
      )}
    </>
  );
}
