/**
 * The gateway's connections to nodes for the calls whose answer it reads (a fork's parts, a
 * listing's pages: ./node-call.ts), kept open between calls: a fork through the gateway then
 * costs no new TCP connection to the node, on either side (measured by bench/cluster-scale.ts:
 * the gateway's CPU per one-child create and its added latency). A connection idle for
 * IDLE_MS is closed by the gateway, before a node closes it (its listener's keep-alive bound,
 * FORKD_KEEPALIVE_TIMEOUT_MS, is 5 s by default; a node that announces a shorter one in its
 * replies' Keep-Alive header is believed), so a call is rarely written on a connection the node
 * is closing.
 */
import { Agent } from "node:http";

export const IDLE_MS = 4_000;

export function nodePool(): Agent {
  return new Agent({ keepAlive: true, timeout: IDLE_MS, scheduling: "lifo" });
}
