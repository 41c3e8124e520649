/**
 * The loopback console's proxy to the daemon's unix socket: a request (body streamed) becomes the
 * same request on the socket, its reply (NDJSON, SSE, bytes: streamed as they come) goes back,
 * and a WebSocket upgrade becomes a spliced pair of sockets. Either side hanging up at any byte
 * ends the other: a browser that goes away ends the daemon-side request, and a daemon reply
 * that breaks off ends the browser's. Hop-by-hop headers and the console's own credentials
 * (Cookie, X-Forkd-Console, X-Forkd-Console-Key) are not forwarded.
 */
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from "node:http";
import { request } from "node:http";
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";

/** Headers never forwarded upstream. */
const DROP = new Set([
  "cookie",
  "x-forkd-console",
  "x-forkd-console-key",
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "authorization",
  "host",
]);

/**
 * How long the daemon has to send a reply's headers (the body may then take as long as it
 * needs). Every daemon operation bounds its own waits; this only catches a daemon that hangs,
 * so it must outlast the longest call (a fork of hundreds, a branch of a large sandbox).
 */
const HEADERS_MS = 15 * 60_000;
/** A WebSocket upgrade (a terminal) is answered at once or not at all. */
const UPGRADE_MS = 60_000;

function forwardHeaders(h: IncomingHttpHeaders, upgrade: boolean): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(h)) {
    if (v === undefined) continue;
    if (DROP.has(k)) continue;
    out[k] = v;
  }
  out.host = "localhost";
  if (upgrade) {
    out.connection = "Upgrade";
    out.upgrade = String(h.upgrade ?? "websocket");
  }
  return out;
}

function replyHeaders(h: IncomingHttpHeaders): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(h)) {
    if (v === undefined || k === "connection" || k === "keep-alive" || k === "transfer-encoding") continue;
    out[k] = v;
  }
  return out;
}

/** Proxies `req` to the daemon on `socketPath`, answering on `res`. Never throws. */
export function proxyRequest(socketPath: string, req: IncomingMessage, res: ServerResponse): void {
  let done = false;
  const up = request({
    socketPath,
    method: req.method,
    path: req.url,
    headers: forwardHeaders(req.headers, false),
  });
  const headersTimer = setTimeout(
    () => up.destroy(new Error("the daemon sent no reply headers")),
    HEADERS_MS,
  );
  const fail = (status: number, message: string) => {
    if (done) return;
    done = true;
    clearTimeout(headersTimer);
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const body = JSON.stringify({ error: { code: "unavailable", message, details: {} } });
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
    res.end(body);
  };
  up.on("response", (upRes) => {
    clearTimeout(headersTimer);
    res.writeHead(upRes.statusCode ?? 502, replyHeaders(upRes.headers));
    // Each chunk as it comes (SSE and NDJSON must not wait for a buffer to fill).
    res.flushHeaders();
    upRes.on("data", (chunk: Buffer) => {
      if (!res.write(chunk)) {
        upRes.pause();
        res.once("drain", () => upRes.resume());
      }
    });
    upRes.on("end", () => {
      done = true;
      res.end();
    });
    // The daemon's reply broke off: so does the browser's.
    upRes.on("aborted", () => {
      done = true;
      res.destroy();
    });
    upRes.on("error", () => {
      done = true;
      res.destroy();
    });
  });
  up.on("error", (e) => fail(502, `the daemon did not answer: ${e.message}`));
  // The browser went away before the reply ended: so does the daemon-side request.
  res.on("close", () => {
    clearTimeout(headersTimer);
    if (!res.writableFinished) up.destroy();
  });
  req.on("aborted", () => up.destroy());
  req.on("error", () => up.destroy());
  req.pipe(up);
}

/**
 * Proxies a WebSocket upgrade: the same upgrade on the socket, then the two connections spliced.
 * A refusal from the daemon (any status but 101) goes back as it is.
 */
export function proxyUpgrade(socketPath: string, req: IncomingMessage, client: Duplex, head: Buffer): void {
  const up = request({
    socketPath,
    method: req.method,
    path: req.url,
    headers: forwardHeaders(req.headers, true),
  });
  const timer = setTimeout(() => up.destroy(new Error("no upgrade reply")), UPGRADE_MS);
  client.on("error", () => up.destroy());
  client.on("close", () => up.destroy());
  up.on("upgrade", (upRes, upSocket: Socket, upHead: Buffer) => {
    clearTimeout(timer);
    const lines = [`HTTP/1.1 101 ${upRes.statusMessage ?? "Switching Protocols"}`];
    for (let i = 0; i < upRes.rawHeaders.length; i += 2)
      lines.push(`${upRes.rawHeaders[i] ?? ""}: ${upRes.rawHeaders[i + 1] ?? ""}`);
    client.write(lines.join("\r\n") + "\r\n\r\n");
    if (upHead.length) client.write(upHead);
    if (head.length) upSocket.write(head);
    upSocket.on("error", () => client.destroy());
    upSocket.on("close", () => client.destroy());
    client.on("close", () => upSocket.destroy());
    upSocket.pipe(client);
    client.pipe(upSocket);
  });
  up.on("response", (upRes) => {
    clearTimeout(timer);
    const lines = [`HTTP/1.1 ${upRes.statusCode ?? 502} ${upRes.statusMessage ?? ""}`];
    for (let i = 0; i < upRes.rawHeaders.length; i += 2) {
      const k = (upRes.rawHeaders[i] ?? "").toLowerCase();
      if (k === "connection" || k === "transfer-encoding" || k === "keep-alive") continue;
      lines.push(`${upRes.rawHeaders[i] ?? ""}: ${upRes.rawHeaders[i + 1] ?? ""}`);
    }
    const chunks: Buffer[] = [];
    let size = 0;
    upRes.on("data", (b: Buffer) => {
      if (size < 64 << 10) chunks.push(b);
      size += b.length;
    });
    upRes.on("end", () => {
      const body = Buffer.concat(chunks);
      lines.push(`content-length: ${body.length}`, "connection: close");
      client.end(Buffer.concat([Buffer.from(lines.join("\r\n") + "\r\n\r\n"), body]));
    });
    upRes.on("error", () => client.destroy());
  });
  up.on("error", () => {
    clearTimeout(timer);
    if (!client.destroyed)
      client.end("HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
  });
  up.end();
}
