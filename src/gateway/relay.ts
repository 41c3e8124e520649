/**
 * Relaying a call to the node that serves it, through the doors' reverse proxy
 * (src/http/proxy-request.ts, proxy-upgrade.ts: bodies streamed both ways, either side's
 * hang-up ends the other, a reply cut upstream is cut for the client). What the gateway adds:
 * the node's address from its record, the console session's token as the bearer (never the
 * console's own cookie or key), E2B's API key and envd access token passed on (the node checks
 * them), the latency until the node's reply headers in the metrics, and every open relay
 * registered under its node, so that a node leaving the cluster (its lease expired: dead or cut
 * off) ends the relays to it at once instead of leaving them to TCP (a call it has not
 * answered yet gets 503, a reply under way is cut). An https node is reached over TLS, its
 * certificate verified (./upstream-of.ts). A node that cannot be reached (or whose certificate
 * is not trusted) is the door's 502, one that does not start its answer in time 504.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { proxyRequest, proxyUpgrade } from "../http/index.js";
import type { Upstream } from "../http/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import type { NodeRecord } from "../cluster/index.js";
import { TICKET_PARAM } from "../access/index.js";
import type { Gateway } from "./context.js";
import { upstreamOf } from "./upstream-of.js";
import { sendE2bError, sendError } from "./reply.js";

export type Door = "rest" | "e2b";

export interface RelayOptions {
  door: Door;
  /** The metric's kind of route ("sandbox", "snapshot", "e2b-plane" ...). */
  kind: string;
  /** Replaces the request's Authorization (a console session's token). */
  authorization?: string | null;
}

/** E2B's credentials a node checks itself. */
const E2B_PASSED: ReadonlySet<string> = new Set(["x-api-key", "x-access-token"]);

const refusal =
  (g: Gateway, door: Door, node: string) =>
  (status: 502 | 504, why: string): { body: string } => {
    g.metrics.nodeFailure(node, status === 504 ? "timeout" : "unreachable");
    return {
      body: JSON.stringify(
        door === "rest"
          ? {
              error: {
                code: "unavailable",
                message: `node ${node} did not answer: ${why}`,
                details: { node },
              },
            }
          : { code: status, message: `node ${node} did not answer: ${why}` },
      ),
    };
  };

/** The node's address for `door`, or the refusal to send. */
function addressOf(g: Gateway, node: NodeRecord, door: Door): Upstream | ForkdError {
  const origin = door === "rest" ? node.api : node.e2b;
  if (origin === null) return new ForkdError("unavailable", `node ${node.id} serves no E2B listener`);
  try {
    return upstreamOf(origin, g.nodeTrust);
  } catch (e) {
    return new ForkdError("unavailable", `node ${node.id}: ${errorMessage(e)}`);
  }
}

/** The request's target without a console ticket (used up at the gateway). */
function targetOf(req: IncomingMessage): string {
  const raw = req.url ?? "/";
  if (!raw.includes(TICKET_PARAM)) return raw;
  const u = new URL(raw, "http://gateway");
  u.searchParams.delete(TICKET_PARAM);
  return u.pathname + u.search;
}

/** Relays `req` to `node`'s REST (or E2B) listener. Never throws. */
export function relay(
  g: Gateway,
  req: IncomingMessage,
  res: ServerResponse,
  node: NodeRecord,
  o: RelayOptions,
): void {
  const to = addressOf(g, node, o.door);
  if (to instanceof ForkdError) {
    req.resume();
    return (o.door === "rest" ? sendError : sendE2bError)(res, to);
  }
  req.url = targetOf(req);
  const started = performance.now();
  // The node leaving the cluster ends the relay: with an answer if none has started, else cut.
  const unregister = g.relays.open(node.id, () => {
    if (res.headersSent) return void res.destroy();
    const gone = new ForkdError("unavailable", `node ${node.id} left the cluster before it answered`, {
      node: node.id,
    });
    (o.door === "rest" ? sendError : sendE2bError)(res, gone);
  });
  res.once("close", unregister);
  proxyRequest(req, res, to, {
    name: `node ${node.id}`,
    refusal: refusal(g, o.door, node.id),
    connectTimeoutMs: g.bounds.connectMs,
    headersTimeoutMs: g.bounds.replyMs,
    ...(o.authorization ? { set: { authorization: o.authorization } } : {}),
    ...(o.door === "e2b" ? { pass: E2B_PASSED } : {}),
    onReply: (status) => g.metrics.proxied(o.kind, status, (performance.now() - started) / 1000),
  });
}

/** Relays the upgrade `req` (a WebSocket) to `node`. Never throws. */
export function relayUpgrade(
  g: Gateway,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  node: NodeRecord,
  o: RelayOptions,
): void {
  const to = addressOf(g, node, o.door);
  if (to instanceof ForkdError) return void socket.destroy();
  req.url = targetOf(req);
  const unregister = g.relays.open(node.id, () => socket.destroy());
  proxyUpgrade(req, socket, head, to, {
    name: `node ${node.id}`,
    refusal: refusal(g, o.door, node.id),
    handshakeTimeoutMs: g.bounds.upgradeMs,
    ...(o.authorization ? { set: { authorization: o.authorization } } : {}),
    ...(o.door === "e2b" ? { pass: E2B_PASSED } : {}),
    done: () => unregister(),
  });
}
