/**
 * Any other port of an E2B sandbox: the guest's own service, proxied over HTTP the way forkd's
 * getHost reaches it. The port is exposed on the host on first use (as `POST .../ports` would:
 * kept in the sandbox's record) and each request is relayed to that host address, bodies
 * streamed both ways; a client that hangs up cuts the upstream request, and a guest that does
 * not answer is a 502 as under E2B's proxy. An HTTP upgrade (WebSocket) is relayed byte for
 * byte by guestPortUpgrade() once the listener hands it over (its `upgrade` event).
 */
import { request } from "node:http";
import type { ClientRequest, IncomingHttpHeaders, IncomingMessage } from "node:http";
import { connect } from "node:net";
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";
import type { E2bServices } from "./context.js";
import { COOKIE } from "../console/sessions.js";
import { errorMessage } from "../util/errors.js";
import { callerOfKey } from "./auth.js";
import type { SandboxPortHandler } from "./sandbox-plane.js";

const CONNECT_TIMEOUT_MS = 10_000;
/** An upstream that sends nothing for this long is cut. */
const IDLE_TIMEOUT_MS = 10 * 60_000;
/** Hop-by-hop headers: the proxy's own, neither forwarded nor returned. */
const HOP_BY_HOP = [
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "upgrade",
  "te",
  "trailer",
];
/** Hop-by-hop headers and the E2B routing and credential headers stay here. */
const DROP = new Set([
  ...HOP_BY_HOP,
  "x-access-token",
  "x-api-key",
  "x-forkd-console",
  "x-forkd-console-key",
]);
/** Dropped from the guest's reply: hop-by-hop headers (and E2B's own, which are the proxy's). */
const DROP_REPLY = new Set(HOP_BY_HOP);

/**
 * What of a request's header `name` (lower case) reaches the guest: `value`, a `Cookie` without
 * the console's session cookies, or null when it stays here: hop-by-hop and E2B's own headers
 * (E2b-Sandbox-*, E2B-Traffic-Access-Token), every credential header of ours (X-Access-Token,
 * X-API-Key, the console's), and an `Authorization: Bearer` whose token is a credential of this
 * daemon (an API key or a sandbox's access token: it authenticated the request, or could
 * have). Any other Authorization (Basic, a token of the guest's own app) is the guest's.
 */
export function guestHeader(s: E2bServices, sandboxId: string, name: string, value: string): string | null {
  if (DROP.has(name) || name.startsWith("e2b-")) return null;
  if (name === "authorization") return isOurBearer(s, sandboxId, value) ? null : value;
  if (name === "cookie") return withoutConsoleCookies(value);
  return value;
}

/** Whether `value` is `Bearer <a credential of this daemon>` (not judgeable without E2B's: yes). */
function isOurBearer(s: E2bServices, sandboxId: string, value: string): boolean {
  const m = /^\s*Bearer\s+(\S+)\s*$/i.exec(value);
  if (!m) return false;
  const e = s.e2b;
  if (!e) return true;
  const token = m[1]!;
  return (
    callerOfKey(e.auth, token.length > 512 ? "" : token) !== null ||
    e.accessTokens.issuedTo(sandboxId, token) !== null
  );
}

/** A Cookie header less the web console's session cookies (null when nothing is left). */
function withoutConsoleCookies(value: string): string | null {
  const kept = value
    .split(";")
    .map((p) => p.trim())
    .filter((p) => {
      if (p === "") return false;
      const eq = p.indexOf("=");
      const n = (eq < 0 ? p : p.slice(0, eq)).trim();
      return n !== COOKIE && !n.startsWith(`${COOKIE}_`);
    });
  return kept.length === 0 ? null : kept.join("; ");
}

function forwarded(s: E2bServices, sandboxId: string, h: IncomingHttpHeaders): IncomingHttpHeaders {
  const out: IncomingHttpHeaders = {};
  for (const [k, v] of Object.entries(h)) {
    if (v === undefined) continue;
    if (Array.isArray(v)) {
      const kept = v.flatMap((x) => guestHeader(s, sandboxId, k, x) ?? []);
      if (kept.length > 0) out[k] = kept;
    } else {
      const x = guestHeader(s, sandboxId, k, v);
      if (x !== null) out[k] = x;
    }
  }
  return out;
}

function replyHeaders(h: IncomingHttpHeaders): IncomingHttpHeaders {
  const out: IncomingHttpHeaders = {};
  for (const [k, v] of Object.entries(h))
    if (!DROP_REPLY.has(k) && !k.startsWith("e2b-") && v !== undefined) out[k] = v;
  return out;
}

/** E2B's proxy's answer when the port answers nothing. */
function portClosed(
  res: Parameters<SandboxPortHandler>[1],
  sandboxId: string,
  port: number,
  why: string,
): void {
  if (res.headersSent || res.destroyed || res.writableEnded) return void res.destroy();
  const body = JSON.stringify({
    code: 502,
    message: `The sandbox is running but port ${port} is not open (${why})`,
    sandboxId,
    port,
  });
  res.writeHead(502, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

/** The host address of guest port `port` ("host:port"), exposing it first if it is not. */
async function hostAddress(s: E2bServices, id: string, port: number): Promise<string> {
  const key = String(port);
  const now = s.sandboxes.get(id).record.network?.ports[key];
  if (now) return now;
  const sb = await s.sandboxes.exposePort(id, port);
  const addr = sb.record.network?.ports[key];
  if (!addr) throw new Error("the port has no host address");
  return addr;
}

/** Upstream statuses a reply can carry (node's client takes 000-099 too; writeHead throws on them). */
const validStatus = (n: number | undefined): n is number => n !== undefined && n >= 100 && n <= 999;

export function guestPortHandler(s: E2bServices): SandboxPortHandler {
  return (req, res, t) => {
    // Nothing here may throw: it runs in the listener's events (an uncaught throw ends the daemon).
    let up: ClientRequest | null = null;
    res.on("error", () => up?.destroy());
    res.on("close", () => {
      if (!res.writableFinished) up?.destroy();
    });
    req.on("error", () => up?.destroy());
    const closed = (why: string) => {
      req.resume();
      portClosed(res, t.sandboxId, t.port, why);
    };
    hostAddress(s, t.sandboxId, t.port).then(
      (addr) => {
        if (res.destroyed) return;
        try {
          up = relay(s, req, res, t, addr);
        } catch (e) {
          closed(errorMessage(e));
        }
      },
      (e: unknown) => closed(errorMessage(e)),
    );
  };
}

/** The upstream request of `req` to `addr`, its reply piped into `res`. */
function relay(
  s: E2bServices,
  req: IncomingMessage,
  res: Parameters<SandboxPortHandler>[1],
  t: { sandboxId: string; port: number },
  addr: string,
): ClientRequest {
  const i = addr.lastIndexOf(":");
  const up = request({
    host: addr.slice(0, i),
    port: Number(addr.slice(i + 1)),
    method: req.method,
    path: req.url ?? "/",
    headers: forwarded(s, t.sandboxId, req.headers),
    timeout: CONNECT_TIMEOUT_MS,
  });
  up.on("socket", (sock) => sock.once("connect", () => up.setTimeout(IDLE_TIMEOUT_MS)));
  up.on("timeout", () => up.destroy(new Error("the guest did not answer in time")));
  let refused = false;
  up.on("response", (ur) => {
    if (!validStatus(ur.statusCode)) {
      // E2B's 502, and the upstream dropped (its errors from now on are its cut, not news).
      refused = true;
      ur.on("error", () => undefined);
      up.destroy();
      portClosed(res, t.sandboxId, t.port, `the guest answered status ${String(ur.statusCode)}`);
      return;
    }
    try {
      res.writeHead(ur.statusCode, replyHeaders(ur.headers));
    } catch {
      // A header node will not send (invalid characters): the reply cannot be relayed.
      refused = true;
      ur.on("error", () => undefined);
      up.destroy();
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
    if (!refused) portClosed(res, t.sandboxId, t.port, errorMessage(e));
  });
  req.pipe(up);
  return up;
}

/** Headers of an upgrade kept as sent (names, order, repeats), less what guestHeader() keeps back. */
function rawHead(s: E2bServices, sandboxId: string, req: IncomingMessage): string {
  let head = `${req.method ?? "GET"} ${req.url ?? "/"} HTTP/1.1\r\n`;
  const h = req.rawHeaders;
  for (let i = 0; i + 1 < h.length; i += 2) {
    const name = h[i]!;
    const lower = name.toLowerCase();
    // The upgrade's own hop-by-hop headers are what it is: they go as sent.
    const value =
      lower === "connection" || lower === "upgrade" ? h[i + 1]! : guestHeader(s, sandboxId, lower, h[i + 1]!);
    if (value === null) continue;
    head += `${name}: ${value.replace(/[\r\n]/g, "")}\r\n`;
  }
  return head + "\r\n";
}

/** The guest's first bytes of an upgrade's reply within this, or the handshake is cut (504). */
const HANDSHAKE_TIMEOUT_MS = 10_000;

export interface UpgradeOptions {
  /** Told once when the client's socket closes: the status the client got (0: none). */
  done?: (status: number) => void;
  /** The guest's reply must start within this (default HANDSHAKE_TIMEOUT_MS). */
  handshakeTimeoutMs?: number;
}

/**
 * Relays an HTTP upgrade (a WebSocket) of guest port `t.port`, already authorized, to the
 * guest: the request as it came, then both directions as bytes until either side closes. A
 * port that cannot be reached answers 502 on the raw socket, a guest that does not start its
 * reply in time 504. `o.done` is told once, when the client's socket closes, the status the
 * client got (the guest's, from its status line; 0 when nothing was answered). Never throws:
 * every error path closes the socket.
 */
export function guestPortUpgrade(
  s: E2bServices,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  t: { sandboxId: string; port: number },
  o: UpgradeOptions = {},
): void {
  const done = o.done ?? (() => undefined);
  let status = 0;
  let answered = false;
  let refused = false;
  let up: Socket | null = null;
  socket.on("error", () => socket.destroy());
  socket.on("close", () => {
    up?.destroy();
    done(status);
  });
  // The listener keeps a socket half-open: a client gone before the guest answered is closed.
  socket.on("end", () => {
    if (!answered && !refused) socket.destroy();
  });
  const refuse = (code: 502 | 504, why: string) => {
    if (refused) return;
    refused = true;
    up?.destroy();
    if (!socket.writable) return void socket.destroy();
    status = code;
    const body = JSON.stringify({
      code,
      message: `The sandbox is running but port ${t.port} is not open (${why})`,
    });
    const reason = code === 502 ? "Bad Gateway" : "Gateway Timeout";
    socket.end(
      `HTTP/1.1 ${code} ${reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
    );
  };
  hostAddress(s, t.sandboxId, t.port).then(
    (addr) => {
      if (socket.destroyed) return;
      try {
        const i = addr.lastIndexOf(":");
        const conn = connect({ host: addr.slice(0, i), port: Number(addr.slice(i + 1)) });
        up = conn;
        // One timer: the connection, then the guest's first byte of its reply.
        const timer = setTimeout(() => {
          if (answered) return;
          refuse(504, "the guest did not answer the upgrade in time");
        }, o.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS);
        conn.once("connect", () => {
          conn.setTimeout(IDLE_TIMEOUT_MS, () => conn.destroy());
          conn.write(rawHead(s, t.sandboxId, req));
          if (head.length > 0) conn.write(head);
          socket.pipe(conn);
        });
        conn.once("data", (first: Buffer) => {
          answered = true;
          clearTimeout(timer);
          status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(first.toString("latin1", 0, 16))?.[1] ?? 0);
          if (!socket.writable) return void conn.destroy();
          socket.write(first);
          conn.pipe(socket);
        });
        conn.on("error", (e) => {
          clearTimeout(timer);
          if (!answered) refuse(502, errorMessage(e));
          else socket.destroy();
        });
        conn.on("close", () => {
          clearTimeout(timer);
          if (!answered) refuse(502, "the guest closed the connection");
          else socket.destroy();
        });
      } catch (e) {
        refuse(502, errorMessage(e));
      }
    },
    (e: unknown) => refuse(502, errorMessage(e)),
  );
}
