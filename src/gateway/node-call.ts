/**
 * One call of the gateway to a node whose answer it must read (a fork's part, a page of a
 * listing, an event stream's start): the request with its body, the reply's status, headers and
 * body read whole within a bound of bytes, all within a deadline (and an abort: the client
 * hung up). A node that cannot be reached, answers late or too much is a ForkdError naming it:
 * `unavailable` (no connection: the request never reached it, safe to send elsewhere) or
 * `timeout` (it may have acted). An https node is reached over TLS (./upstream-of.ts): the
 * connection counts as made once the handshake verified its certificate, so a node whose
 * certificate is not trusted is one the call never reached. Over a pool of kept-alive
 * connections (`pool`: the gateway's own, ./node-pool.ts), a call on a connection already open
 * counts as reaching the node: a failure there is never taken for one that surely did not arrive.
 */
import type { IncomingHttpHeaders, IncomingMessage } from "node:http";
import type { SecureContext } from "node:tls";
import { overTls, readyEvent, requestTo } from "../http/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import type { NodePool } from "./node-pool.js";
import { upstreamOf } from "./upstream-of.js";

export interface NodeCall {
  method: string;
  path: string;
  headers?: Record<string, string>;
  body?: Buffer;
  /** The whole call (connection, request, reply) must end within this. */
  timeoutMs: number;
  /** A connection must open within this (default 5 s). */
  connectMs?: number;
  /** The reply's body may hold at most this (default 16 MiB). */
  maxBytes?: number;
  signal?: AbortSignal;
  /** Connections kept open to the nodes (default: a new connection for this call). */
  pool?: NodePool;
  /** The CAs an https node's certificate must chain to (the gateway's; null: Node's). */
  trust: SecureContext | null;
}

export interface NodeReply {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** Whether a failed call surely never reached the node (it may be sent to another). */
export const neverReached = (e: unknown): boolean =>
  e instanceof ForkdError && e.code === "unavailable" && e.details.reached === false;

/** Calls node `name` at `origin`; the reply whatever its status, or a ForkdError. */
export function callNode(name: string, origin: string, c: NodeCall): Promise<NodeReply> {
  return new Promise((resolve, reject) => {
    let to;
    try {
      to = upstreamOf(origin, c.trust);
    } catch (e) {
      return reject(
        new ForkdError("unavailable", `node ${name}: ${errorMessage(e)}`, { node: name, reached: false }),
      );
    }
    let settled = false;
    let connected = false;
    const finish = (e: ForkdError | null, r?: NodeReply) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      c.signal?.removeEventListener("abort", onAbort);
      if (e) {
        req.destroy();
        reject(e);
      } else resolve(r as NodeReply);
    };
    const req = requestTo(to, {
      method: c.method,
      path: c.path,
      headers: {
        ...(c.body ? { "content-type": "application/json", "content-length": String(c.body.length) } : {}),
        ...c.headers,
      },
      agent: c.pool ? (overTls(to) ? c.pool.https : c.pool.http) : false,
    });
    const timer = setTimeout(
      () =>
        finish(
          connected
            ? new ForkdError("timeout", `node ${name} did not answer within ${c.timeoutMs} ms`, {
                node: name,
              })
            : new ForkdError("unavailable", `node ${name} took no connection in time`, {
                node: name,
                reached: false,
              }),
        ),
      c.timeoutMs,
    );
    const onAbort = () => finish(new ForkdError("unavailable", "the client went away", { node: name }));
    c.signal?.addEventListener("abort", onAbort);
    if (c.signal?.aborted) return onAbort();
    req.on("socket", (sock) => {
      // A pooled connection, open already: what is written on it may reach the node.
      if (!sock.connecting) {
        connected = true;
        return;
      }
      const t = setTimeout(() => {
        if (!connected)
          finish(
            new ForkdError("unavailable", `node ${name} took no connection in time`, {
              node: name,
              reached: false,
            }),
          );
      }, c.connectMs ?? 5_000);
      sock.once(readyEvent(to), () => {
        connected = true;
        clearTimeout(t);
      });
      sock.once("close", () => clearTimeout(t));
    });
    req.on("error", (e) =>
      finish(
        new ForkdError(
          "unavailable",
          `node ${name} did not answer: ${errorMessage(e)}`,
          connected ? { node: name } : { node: name, reached: false },
        ),
      ),
    );
    req.on("response", (r: IncomingMessage) => {
      const parts: Buffer[] = [];
      let got = 0;
      const max = c.maxBytes ?? 16 << 20;
      r.on("data", (b: Buffer) => {
        got += b.length;
        if (got > max)
          return finish(
            new ForkdError("unavailable", `node ${name} answered more than ${max} bytes`, { node: name }),
          );
        parts.push(b);
      });
      r.on("error", (e) =>
        finish(
          new ForkdError("unavailable", `node ${name}'s answer broke off: ${errorMessage(e)}`, {
            node: name,
          }),
        ),
      );
      r.on("end", () => {
        if (!r.complete)
          return finish(new ForkdError("unavailable", `node ${name}'s answer broke off`, { node: name }));
        finish(null, { status: r.statusCode ?? 0, headers: r.headers, body: Buffer.concat(parts) });
      });
      r.on("close", () => {
        if (!r.complete)
          finish(new ForkdError("unavailable", `node ${name}'s answer broke off`, { node: name }));
      });
    });
    req.end(c.body);
  });
}

/** A node reply's body as JSON (null: not JSON). */
export function replyJson(r: NodeReply): unknown {
  try {
    return JSON.parse(r.body.toString("utf8"));
  } catch {
    return null;
  }
}
