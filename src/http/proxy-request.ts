/**
 * The reverse proxy of one HTTP request (every door's: E2B's guest ports, the web console's
 * daemon socket): the request, its body streamed, becomes the same request upstream, and the
 * reply (NDJSON, SSE, bytes) comes back as it comes, paced by the client. Either side hanging
 * up at any byte ends the other: a client gone ends the upstream request, and an upstream reply
 * that breaks off is cut here too (never ended as if complete). Headers pass as
 * ./proxy-headers.ts says; an upstream over TLS is reached as ./upstream.ts says. Bounds: the
 * connection (connectTimeoutMs; over TLS, its handshake too), the reply's headers
 * (headersTimeoutMs), and an idle connection (idleTimeoutMs). An upstream that answers
 * nothing, late or nothing valid (a status node will not send, a header it will not write) gets
 * the door's refusal (502) if the client has had no byte yet, else the client's reply is cut.
 * Nothing here throws: it runs in a listener's events.
 */
import type { ClientRequest, IncomingMessage, ServerResponse } from "node:http";
import { errorMessage } from "../util/index.js";
import type { HeaderFilter, PassedCredentials } from "./proxy-headers.js";
import { replyHeaders, upstreamHeaders } from "./proxy-headers.js";
import type { RelayOptions, Upstream } from "./upstream.js";
import { CONNECT_TIMEOUT_MS, readyEvent, requestTo } from "./upstream.js";

export interface ProxyRequestOptions extends RelayOptions {
  /** A connection to upstream must be open within this (default CONNECT_TIMEOUT_MS). */
  connectTimeoutMs?: number;
  /** A door's own rule for a request header (after the common ones; default: keep). */
  keep?: HeaderFilter;
  /** Headers set upstream, replacing the request's (e.g. Host). */
  set?: Record<string, string>;
  /** A door's own rule for a reply header (after hop-by-hop; default: keep). */
  keepReply?: HeaderFilter;
  /** The reply's headers must come within this of the request (default: none). */
  headersTimeoutMs?: number;
  /** Credential headers this door forwards as they came (./proxy-headers.ts; default: none). */
  pass?: PassedCredentials;
  /** Told once upstream's reply head came (its status): a door's latency metric. */
  onReply?: (status: number) => void;
}

const keepAll: HeaderFilter = (_n, v) => v;

/** Upstream statuses a reply can carry (node's client takes 000-099 too; writeHead throws on them). */
const validStatus = (n: number | undefined): n is number => n !== undefined && n >= 100 && n <= 999;

/**
 * Relays `req` to `to` (an address, or one still being found: its failure is the door's 502)
 * and its reply into `res`.
 */
export function proxyRequest(
  req: IncomingMessage,
  res: ServerResponse,
  to: Upstream | Promise<Upstream>,
  o: ProxyRequestOptions,
): void {
  let up: ClientRequest | null = null;
  res.on("error", () => up?.destroy());
  res.on("close", () => {
    if (!res.writableFinished) up?.destroy();
  });
  req.on("error", () => up?.destroy());
  Promise.resolve(to).then(
    (addr) => {
      if (res.destroyed) return void req.resume();
      try {
        up = relay(req, res, addr, o);
      } catch (e) {
        req.resume();
        refuse(res, o, 502, errorMessage(e));
      }
    },
    (e: unknown) => {
      req.resume();
      refuse(res, o, 502, errorMessage(e));
    },
  );
}

/** The door's refusal, or a cut when the client has had part of a reply already. */
function refuse(res: ServerResponse, o: RelayOptions, status: 502 | 504, why: string): void {
  // A reply that ended whole (answered already) is left to go out; one under way is cut.
  if (res.writableEnded) return;
  if (res.headersSent || res.destroyed) return void res.destroy();
  const r = o.refusal(status, why);
  res.writeHead(status, {
    "content-type": r.contentType ?? "application/json",
    "content-length": Buffer.byteLength(r.body),
  });
  res.end(r.body);
}

/** The upstream request of `req`, its reply piped into `res`. */
function relay(
  req: IncomingMessage,
  res: ServerResponse,
  to: Upstream,
  o: ProxyRequestOptions,
): ClientRequest {
  const up = requestTo(to, {
    // Node's global agent cuts a socket silent for 5 s (its keep-alive timeout, applied to a
    // request in flight too): a relayed call may be silent for minutes (an exec, a build).
    timeout: o.idleTimeoutMs ?? 0,
    method: req.method,
    path: req.url ?? "/",
    headers: upstreamHeaders(req.headers, o.keep ?? keepAll, o.set, o.pass),
  });
  const timers: NodeJS.Timeout[] = [];
  const within = (ms: number | undefined, why: string) => {
    if (ms === undefined) return undefined;
    const t = setTimeout(() => up.destroy(new Error(why)), ms);
    timers.push(t);
    return t;
  };
  const clear = () => timers.forEach((t) => clearTimeout(t));
  within(o.headersTimeoutMs, `${o.name} sent no reply headers in time`);
  up.on("socket", (sock) => {
    // A pooled socket is connected already: the connect bound is for a new one (over TLS, until
    // its handshake is done).
    if (!sock.connecting) return;
    const t = within(o.connectTimeoutMs ?? CONNECT_TIMEOUT_MS, `${o.name} took no connection in time`);
    sock.once(readyEvent(to), () => clearTimeout(t));
  });
  if (o.idleTimeoutMs !== undefined) up.setTimeout(o.idleTimeoutMs);
  up.on("timeout", () => up.destroy(new Error(`${o.name} sent nothing in time`)));
  up.on("close", clear);
  let refused = false;
  const drop = (ur: IncomingMessage) => {
    // The upstream dropped: its errors from now on are its cut, not news.
    refused = true;
    ur.on("error", () => undefined);
    up.destroy();
  };
  up.on("response", (ur) => {
    clear();
    if (!validStatus(ur.statusCode)) {
      drop(ur);
      refuse(res, o, 502, `${o.name} answered status ${String(ur.statusCode)}`);
      return;
    }
    try {
      o.onReply?.(ur.statusCode);
    } catch {
      // a metric's own failure is not the reply's
    }
    try {
      res.writeHead(ur.statusCode, replyHeaders(ur.headers, o.keepReply ?? keepAll));
      // Sent now: an event stream's headers must not wait for its first event.
      res.flushHeaders();
    } catch {
      // A header node will not send (invalid characters): the reply cannot be relayed.
      drop(ur);
      res.destroy();
      return;
    }
    ur.on("error", () => res.destroy());
    // A reply cut before its end is cut here too (not ended as if complete).
    ur.on("close", () => {
      if (!ur.complete) res.destroy();
    });
    ur.pipe(res);
  });
  up.on("error", (e) => {
    clear();
    if (!refused) refuse(res, o, 502, errorMessage(e));
  });
  req.pipe(up);
  return up;
}
