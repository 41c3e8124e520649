/**
 * The same call to every node of the cluster at once (a listing's page, the pending snapshots, a
 * tag not in the catalog), each bounded by the listing bound: each node's reply, or why it gave
 * none. Nodes on the E2B door without an E2B listener are left out.
 */
import type { NodeRecord } from "../cluster/index.js";
import type { Gateway } from "./context.js";
import { callNode } from "./node-call.js";
import type { NodeReply } from "./node-call.js";

export interface NodeAnswer {
  node: NodeRecord;
  reply: NodeReply | null;
  error: unknown;
}

export async function fanOut(
  g: Gateway,
  door: "rest" | "e2b",
  path: string,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<NodeAnswer[]> {
  const nodes = g.view.nodes().filter((n) => door === "rest" || n.e2b !== null);
  return Promise.all(
    nodes.map(async (node) => {
      try {
        const reply = await callNode(node.id, door === "rest" ? node.api : (node.e2b as string), {
          method: "GET",
          path,
          headers,
          timeoutMs: g.bounds.listMs,
          connectMs: g.bounds.connectMs,
          signal,
          pool: g.pool,
          trust: g.nodeTrust,
        });
        return { node, reply, error: null };
      } catch (error) {
        g.metrics.nodeFailure(node.id, "listing");
        return { node, reply: null, error };
      }
    }),
  );
}

/** Headers that carry the caller's credential to a node. */
export function credentialHeaders(authorization: string | null): Record<string, string> {
  return authorization ? { authorization } : {};
}
