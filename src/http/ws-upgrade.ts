/**
 * A WebSocket upgrade hook (an HTTP server's `upgrade` event) over an app (Hono's `fetch`): the
 * request goes through the same app as any other, so its edge's caller, scope, limits and audit
 * apply; a route that takes the upgrade calls `c.env.wsUpgrade.accept(onOpen)` and returns any
 * reply, and only then is the handshake completed and `onOpen` given the socket. Otherwise the
 * app's reply (a 401, 403, 404, 409 with its JSON envelope) is sent and the connection closed.
 * Only GETs of the paths the caller names (`takes`: the REST API's terminal) are run: any other
 * target is refused before a route runs (its reply, a stream or a download, would be read with
 * nobody to end it); of a refusal at most 64 KiB of its body is read. Messages are bounded
 * (1 MiB) and never compressed.
 */
import type { IncomingMessage } from "node:http";
import { STATUS_CODES } from "node:http";
import type { Duplex } from "node:stream";
import { WebSocketServer } from "ws";
import type { WebSocket } from "ws";

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

/** What the app is given with an upgrade request (its bindings: Hono's `c.env`). */
export interface UpgradeBindings {
  incoming: IncomingMessage;
  wsUpgrade: WsUpgrade;
}

/** An app that answers a request (a Hono app). */
export interface UpgradeApp {
  fetch(request: Request, env: UpgradeBindings): Response | Promise<Response>;
}

/** The targets that take an upgrade: GETs of paths `path` matches, named `name` in a refusal. */
export interface UpgradeTargets {
  path: RegExp;
  name: string;
}

export function wsUpgradeHandler(
  app: UpgradeApp,
  takes: UpgradeTargets,
  onError: (e: unknown) => void,
): UpgradeListener {
  const wss = new WebSocketServer({ noServer: true, maxPayload: WS_MAX_MESSAGE, perMessageDeflate: false });
  return (req, socket, head) => {
    socket.on("error", () => socket.destroy());
    answer(app, takes, wss, req, socket, head).catch((e: unknown) => {
      onError(e);
      socket.destroy();
    });
  };
}

/** A refusal on the raw socket, without running any route. */
function refuse(socket: Duplex, status: number, message: string): void {
  if (socket.destroyed) return;
  const body = Buffer.from(JSON.stringify({ error: { code: "invalid_argument", message } }));
  socket.write(
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ""}\r\ncontent-type: application/json\r\n` +
      `content-length: ${body.length}\r\nconnection: close\r\n\r\n`,
  );
  socket.end(body);
}

/** At most `max` bytes of a reply's body; the rest is cancelled, never read. */
async function prefix(res: Response, max: number): Promise<Buffer> {
  const reader: ReadableStreamDefaultReader<Uint8Array> | undefined = res.body?.getReader();
  if (!reader) return Buffer.alloc(0);
  const parts: Buffer[] = [];
  let got = 0;
  try {
    while (got < max) {
      const { done, value } = await reader.read();
      if (done) break;
      parts.push(Buffer.from(value));
      got += value.length;
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
  return Buffer.concat(parts).subarray(0, max);
}

async function answer(
  app: UpgradeApp,
  takes: UpgradeTargets,
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
  let url: URL;
  try {
    url = new URL(req.url ?? "/", "http://localhost");
  } catch {
    return refuse(socket, 400, "a malformed request target");
  }
  // Only what takes an upgrade: any other route run here would have its reply (a stream, a
  // download) read with nobody to end it.
  if (req.method !== "GET" || !takes.path.test(url.pathname))
    return refuse(socket, 400, `only ${takes.name} takes a WebSocket upgrade`);
  const res = await app.fetch(new Request(url, { headers }), { incoming: req, wsUpgrade: upgrade });
  const open = onOpen as ((ws: WebSocket) => void) | null;
  if (open === null || res.status >= 300) {
    const body = await prefix(res, MAX_REFUSAL_BODY);
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
