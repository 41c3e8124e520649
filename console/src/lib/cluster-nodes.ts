/**
 * What the console makes of a cluster's nodes (GET /v1/nodes): the answer a server gives (a
 * gateway's list; one daemon's 404: no cluster; a tenant's 403: not theirs to see), each node's
 * state and free slots, the cluster's totals, and whether sandboxes name nodes at all (a column
 * is shown only then).
 */
import type { ClusterNode } from "../api/types.js";

export type NodesAnswer =
  | { kind: "nodes"; nodes: ClusterNode[] }
  /** One daemon, not a cluster gateway: it has no nodes (404). */
  | { kind: "alone"; message: string }
  /** The caller is no admin (403). */
  | { kind: "forbidden"; message: string };

/** A refusal that is an answer (no cluster, or not an admin); null: a failure to show as one. */
export function refusalAnswer(status: number, message: string): NodesAnswer | null {
  if (status === 404) return { kind: "alone", message };
  if (status === 403) return { kind: "forbidden", message };
  return null;
}

/** A node takes new work unless it drains; a node that left the cluster is not listed at all. */
export const nodeState = (n: ClusterNode): "serving" | "draining" => (n.draining ? "draining" : "serving");

/** Sandboxes it may still take (FORKD_MAX_SANDBOXES less those running or paused). */
export const freeSlots = (n: ClusterNode): number =>
  Math.max(0, n.capacity.max_sandboxes - n.capacity.running - n.capacity.paused);

export interface ClusterTotals {
  nodes: number;
  draining: number;
  running: number;
  paused: number;
  free: number;
  cores: number;
}

export function clusterTotals(nodes: readonly ClusterNode[]): ClusterTotals {
  const t: ClusterTotals = { nodes: nodes.length, draining: 0, running: 0, paused: 0, free: 0, cores: 0 };
  for (const n of nodes) {
    if (n.draining) t.draining++;
    t.running += n.capacity.running;
    t.paused += n.capacity.paused;
    t.free += n.draining ? 0 : freeSlots(n);
    t.cores += n.capacity.cores;
  }
  return t;
}

/** Whether any sandbox says which node runs it (a cluster); one daemon's say null. */
export const anyNode = (sandboxes: readonly { node: string | null }[]): boolean =>
  sandboxes.some((s) => s.node !== null);
