/**
 * Any other port of an E2B sandbox: the guest's own service, proxied over HTTP the way forkd's
 * getHost reaches it. The port is exposed on the host on first use (as `POST .../ports` would:
 * kept in the sandbox's record) and each request is relayed to that host address, bodies
 * streamed both ways; a client that hangs up cuts the upstream request, and a guest that does
 * not answer is a 502 as under E2B's proxy. An HTTP upgrade (WebSocket) is relayed byte for
 * byte by guestPortUpgrade() once the listener hands it over (its `upgrade` event).
 */
import { request } from "node:http";
import type { IncomingHttpHeaders, IncomingMessage } from "node:http";
import { connect } from "node:net";
import type { Duplex } from "node:stream";
import type { Services } from "../api/services.js";
import { errorMessage } from "../util/errors.js";
import type { SandboxPortHandler } from "./sandbox-plane.js";

const CONNECT_TIMEOUT_MS = 10_000;
/** An upstream that sends nothing for this long is cut. */
const IDLE_TIMEOUT_MS = 10 * 60_000;
/** Hop-by-hop headers and the E2B routing and credential headers stay here. */
const DROP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "upgrade",
  "te",
  "trailer",
  "e2b-sandbox-id",
  "e2b-sandbox-port",
  "x-access-token",
  "x-api-key",
  "e2b-traffic-access-token",
]);

function forwarded(h: IncomingHttpHeaders): IncomingHttpHeaders {
  const out: IncomingHttpHeaders = {};
  for (const [k, v] of Object.entries(h)) if (!DROP.has(k) && v !== undefined) out[k] = v;
  return out;
}

/** E2B's proxy's answer when the port answers nothing. */
function portClosed(
  res: Parameters<SandboxPortHandler>[1],
  sandboxId: string,
  port: number,
  why: string,
): void {
  if (res.headersSent) return void res.destroy();
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
async function hostAddress(s: Services, id: string, port: number): Promise<string> {
  const key = String(port);
  const now = s.sandboxes.get(id).record.network?.ports[key];
  if (now) return now;
  const sb = await s.sandboxes.exposePort(id, port);
  const addr = sb.record.network?.ports[key];
  if (!addr) throw new Error("the port has no host address");
  return addr;
}

export function guestPortHandler(s: Services): SandboxPortHandler {
  return (req, res, t) => {
    hostAddress(s, t.sandboxId, t.port).then(
      (addr) => {
        const i = addr.lastIndexOf(":");
        const up = request({
          host: addr.slice(0, i),
          port: Number(addr.slice(i + 1)),
          method: req.method,
          path: req.url ?? "/",
          headers: forwarded(req.headers),
          timeout: CONNECT_TIMEOUT_MS,
        });
        up.on("socket", (sock) => sock.once("connect", () => up.setTimeout(IDLE_TIMEOUT_MS)));
        up.on("timeout", () => up.destroy(new Error("the guest did not answer in time")));
        up.on("response", (ur) => {
          const headers = forwarded(ur.headers);
          res.writeHead(ur.statusCode ?? 502, headers);
          ur.pipe(res);
          ur.on("error", () => res.destroy());
        });
        up.on("error", (e) => portClosed(res, t.sandboxId, t.port, errorMessage(e)));
        res.on("close", () => {
          if (!res.writableFinished) up.destroy();
        });
        req.pipe(up);
        req.on("error", () => up.destroy());
      },
      (e: unknown) => {
        req.resume();
        portClosed(res, t.sandboxId, t.port, errorMessage(e));
      },
    );
  };
}

/** Headers of an upgrade kept as sent (names, order, repeats), less E2B's and credentials. */
function rawHead(req: IncomingMessage): string {
  let head = `${req.method ?? "GET"} ${req.url ?? "/"} HTTP/1.1\r\n`;
  const h = req.rawHeaders;
  for (let i = 0; i + 1 < h.length; i += 2) {
    const name = h[i]!;
    const lower = name.toLowerCase();
    if (lower.startsWith("e2b-") || lower === "x-access-token" || lower === "x-api-key") continue;
    head += `${name}: ${h[i + 1]!.replace(/[\r\n]/g, "")}\r\n`;
  }
  return head + "\r\n";
}

/**
 * Relays an HTTP upgrade (a WebSocket) of guest port `t.port`, already authorized, to the
 * guest: the request as it came, then both directions as bytes until either side closes. A
 * port that cannot be reached answers 502 on the raw socket.
 */
export function guestPortUpgrade(
  s: Services,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  t: { sandboxId: string; port: number },
): void {
  socket.on("error", () => socket.destroy());
  const refuse = (why: string) => {
    const body = JSON.stringify({
      code: 502,
      message: `The sandbox is running but port ${t.port} is not open (${why})`,
    });
    if (socket.writable)
      socket.end(
        `HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
  };
  hostAddress(s, t.sandboxId, t.port).then(
    (addr) => {
      const i = addr.lastIndexOf(":");
      const up = connect({ host: addr.slice(0, i), port: Number(addr.slice(i + 1)) });
      const timer = setTimeout(() => up.destroy(new Error("connect timeout")), CONNECT_TIMEOUT_MS);
      let connected = false;
      up.once("connect", () => {
        connected = true;
        clearTimeout(timer);
        up.setTimeout(IDLE_TIMEOUT_MS, () => up.destroy());
        up.write(rawHead(req));
        if (head.length > 0) up.write(head);
        socket.pipe(up);
        up.pipe(socket);
      });
      up.on("error", (e) => {
        clearTimeout(timer);
        if (!connected) refuse(errorMessage(e));
        else socket.destroy();
      });
      up.on("close", () => connected && socket.destroy());
      socket.on("close", () => up.destroy());
    },
    (e: unknown) => refuse(errorMessage(e)),
  );
}
