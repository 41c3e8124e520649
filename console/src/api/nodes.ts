/**
 * A cluster's nodes (GET /v1/nodes: a gateway's, admins only). One daemon answers 404 and a
 * tenant 403: both are answers (lib/cluster-nodes.ts), not failures to show.
 */
import type { NodesAnswer } from "../lib/cluster-nodes";
import { refusalAnswer } from "../lib/cluster-nodes";
import { ApiError, api } from "./http";
import type { NodeList } from "./types";

export async function loadNodes(): Promise<NodesAnswer> {
  try {
    return { kind: "nodes", nodes: (await api<NodeList>("GET", "/v1/nodes")).nodes };
  } catch (e) {
    const answer = e instanceof ApiError ? refusalAnswer(e.status, e.message) : null;
    if (answer) return answer;
    throw e;
  }
}
