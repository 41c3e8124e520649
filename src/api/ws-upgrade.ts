/**
 * The daemon's WebSocket upgrade hook (the HTTP server's `upgrade` event): the request goes
 * through the same Hono app as any other, so the edge's caller, scope, limits and audit apply;
 * a route that takes the upgrade calls `c.env.wsUpgrade.accept(onOpen)` and returns any reply,
 * and only then is the handshake completed and `onOpen` given the socket. Otherwise the app's
 * reply (a 401, 403, 404, 409 with its JSON envelope) is sent and the connection closed.
 * Messages are bounded (1 MiB) and never compressed.
 */
import type { IncomingMessage } from "node:http";
import { STATUS_CODES } from "node:http";
import type { Duplex } from "node:stream";
import type { Hono } from "hono";
import { WebSocketServer } from "ws";
import type { WebSocket } from "ws";
import type { ApiEnv } from "./env.js";

/** What an upgrade request carries in its bindings (c.env.wsUpgrade). */
export interface WsUpgrade {
  /** Takes the upgrade: `onOpen` is called with the socket once the handshake is done. */
  accept(onOpen: (ws: WebSocket) => void): void;
}

/** The largest message a client may send. */
export const WS_MAX_MESSAGE = 1 << 20;
/** An app reply to an upgrade that is not taken is sent with at most this much of its body. */
const MAX_REFUSAL_BODY = 64 << 10;

export type UpgradeListener = (req: IncomingMessage, socket: Duplex, head: Buffer) => void;

export function wsUpgradeHandler(app: Hono<ApiEnv>, onError: (e: unknown) => void): UpgradeListener {
  const wss = new WebSocketServer({ noServer: true, maxPayload: WS_MAX_MESSAGE, perMessageDeflate: false });
  return (req, socket, head) => {
    socket.on("error", () => socket.destroy());
    answer(app, wss, req, socket, head).catch((e: unknown) => {
      onError(e);
      socket.destroy();
    });
  };
}

async function answer(
  app: Hono<ApiEnv>,
  wss: WebSocketServer,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
): Promise<void> {
  let onOpen: ((ws: WebSocket) => void) | null = null;
  const upgrade: WsUpgrade = {
    accept(fn) {
      onOpen = fn;
    },
  };
  const headers = new Headers();
  for (const [k, v] of Object.entries(req.headers)) {
    if (v === undefined) continue;
    for (const one of Array.isArray(v) ? v : [v]) headers.append(k, one);
  }
  const url = new URL(req.url ?? "/", "http://localhost");
  const res = await app.fetch(new Request(url, { headers }), { incoming: req, wsUpgrade: upgrade });
  const open = onOpen as ((ws: WebSocket) => void) | null;
  if (open === null || res.status >= 300) {
    const body = Buffer.from(await res.arrayBuffer()).subarray(0, MAX_REFUSAL_BODY);
    if (socket.destroyed) return;
    const type = res.headers.get("content-type");
    socket.write(
      `HTTP/1.1 ${res.status} ${STATUS_CODES[res.status] ?? ""}\r\n` +
        (type ? `content-type: ${type}\r\n` : "") +
        `content-length: ${body.length}\r\nconnection: close\r\n\r\n`,
    );
    socket.end(body);
    return;
  }
  await res.body?.cancel();
  if (socket.destroyed) return;
  wss.handleUpgrade(req, socket, head, (ws) => open(ws));
}
