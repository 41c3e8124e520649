/**
 * GET /v1/nodes (admins): the nodes of the cluster as their records say (docs/api.md,
 * "Nodes"): id, addresses, version, machine, capacity and load, whether draining, and the
 * snapshots each holds (with its warm pool members of each).
 */
import type { ClusterView, NodeRecord } from "../cluster/index.js";

export function nodeView(n: NodeRecord, view: ClusterView): Record<string, unknown> {
  const c = n.capacity;
  return {
    id: n.id,
    api: n.api,
    e2b: n.e2b,
    version: n.version,
    started: n.started,
    updated: n.updated,
    draining: n.draining,
    machine: n.machine,
    capacity: {
      cores: c.cores,
      memory_mib: c.memoryMiB,
      free_memory_mib: c.freeMemoryMiB,
      max_sandboxes: c.maxSandboxes,
      running: c.running,
      paused: c.paused,
    },
    load: c.maxSandboxes > 0 ? (c.running + c.paused) / c.maxSandboxes : 1,
    holds: view
      .holdingsOf(n.id)
      .map((h) => ({ tag: h.key, digest: h.digest, warm: h.warm }))
      .sort((a, b) => (a.tag < b.tag ? -1 : a.tag > b.tag ? 1 : 0)),
  };
}

export function nodesView(view: ClusterView): { nodes: Record<string, unknown>[] } {
  return {
    nodes: view
      .nodes()
      .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0))
      .map((n) => nodeView(n, view)),
  };
}
