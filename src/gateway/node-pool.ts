/**
 * The gateway's connections to nodes for the calls whose answer it reads (a fork's parts, a
 * listing's pages: ./node-call.ts), kept open between calls: a fork through the gateway then
 * costs no new TCP connection (nor TLS handshake) to the node, on either side (measured by
 * bench/cluster-scale.ts: the gateway's CPU per one-child create and its added latency). One
 * pool for http nodes and one for https nodes, kept alike. A connection idle for IDLE_MS is
 * closed by the gateway, before a node closes it (its listener's keep-alive bound,
 * FORKD_KEEPALIVE_TIMEOUT_MS, is 5 s by default; a node that announces a shorter one in its
 * replies' Keep-Alive header is believed), so a call is rarely written on a connection the node
 * is closing.
 */
import { Agent } from "node:http";
import { Agent as HttpsAgent } from "node:https";

export const IDLE_MS = 4_000;

export interface NodePool {
  http: Agent;
  https: HttpsAgent;
}

const KEEP = { keepAlive: true, timeout: IDLE_MS, scheduling: "lifo" } as const;

export function nodePool(): NodePool {
  return { http: new Agent(KEEP), https: new HttpsAgent(KEEP) };
}

/** Closes every connection of `p`. */
export function closePool(p: NodePool): void {
  p.http.destroy();
  p.https.destroy();
}
