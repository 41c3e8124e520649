/**
 * The reverse proxy of an HTTP upgrade (a WebSocket; every door's: E2B's guest ports, the web
 * console's terminals), already authorized: the request head as it came (./proxy-headers.ts's
 * upgradeHead: what the door keeps back removed), then both directions as bytes until either
 * side closes. Upstream's answer is relayed byte for byte, a 101 or a refusal with its body, so
 * nothing of it is buffered here; an upstream over TLS is reached as ./upstream.ts says. Bounds:
 * the connection (over TLS: its handshake too) and upstream's first byte (handshakeTimeoutMs:
 * 504 after it), and an idle connection (idleTimeoutMs). An upstream that
 * cannot be reached or closes before answering is the door's 502 on the raw socket. A client
 * that goes before upstream answered (also half-open: it only sent its FIN) is closed.
 * `done` is told once, when the client's socket closes, the status the client got (upstream's,
 * from its status line; 0 when nothing was answered). Never throws: every error path closes
 * the socket.
 */
import { STATUS_CODES } from "node:http";
import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";
import { errorMessage } from "../util/index.js";
import type { HeaderFilter, PassedCredentials } from "./proxy-headers.js";
import { upgradeHead } from "./proxy-headers.js";
import type { RelayOptions, Upstream } from "./upstream.js";
import { connectTo, readyEvent } from "./upstream.js";

export interface ProxyUpgradeOptions extends RelayOptions {
  /** A door's own rule for a request header (after the common ones; default: keep). */
  keep?: HeaderFilter;
  /** Headers set upstream, replacing the request's (e.g. Host). */
  set?: Record<string, string>;
  /** Upstream's first byte of its answer must come within this of the start. */
  handshakeTimeoutMs: number;
  /** Told once when the client's socket closes: the status the client got (0: none). */
  done?: (status: number) => void;
  /** Credential headers this door forwards as they came (./proxy-headers.ts; default: none). */
  pass?: PassedCredentials;
}

/** How long a client has to take the last bytes of a reply upstream ended, before it is cut. */
const CLOSE_GRACE_MS = 5_000;

/** Relays the upgrade `req` (its socket and first bytes) to `to` (an address, or one being found). */
export function proxyUpgrade(
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  to: Upstream | Promise<Upstream>,
  o: ProxyUpgradeOptions,
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
  // The listener keeps a socket half-open: a client gone before upstream answered is closed.
  socket.on("end", () => {
    if (!answered && !refused) socket.destroy();
  });
  const refuse = (code: 502 | 504, why: string) => {
    if (refused) return;
    refused = true;
    up?.destroy();
    if (!socket.writable) return void socket.destroy();
    status = code;
    const r = o.refusal(code, why);
    socket.end(
      `HTTP/1.1 ${code} ${STATUS_CODES[code] ?? ""}\r\ncontent-type: ${r.contentType ?? "application/json"}\r\n` +
        `content-length: ${Buffer.byteLength(r.body)}\r\nconnection: close\r\n\r\n${r.body}`,
    );
  };
  // One timer: the connection, then upstream's first byte of its answer.
  const timer = setTimeout(() => {
    if (!answered) refuse(504, `${o.name} did not answer the upgrade in time`);
  }, o.handshakeTimeoutMs);
  socket.on("close", () => clearTimeout(timer));
  Promise.resolve(to).then(
    (addr) => {
      if (socket.destroyed || refused) return;
      try {
        const conn = connectTo(addr);
        up = conn;
        // Over TLS the head goes once the handshake verified the upstream's certificate.
        conn.once(readyEvent(addr), () => {
          if (o.idleTimeoutMs !== undefined) conn.setTimeout(o.idleTimeoutMs, () => conn.destroy());
          conn.write(upgradeHead(req, o.keep ?? ((_n, v) => v), o.set, o.pass));
          if (head.length > 0) conn.write(head);
          socket.pipe(conn);
        });
        conn.once("data", (first: Buffer) => {
          answered = true;
          clearTimeout(timer);
          status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(first.toString("latin1", 0, 16))?.[1] ?? 0);
          if (!socket.writable) return void conn.destroy();
          socket.write(first);
          conn.pipe(socket, { end: false });
        });
        conn.on("error", (e) => {
          clearTimeout(timer);
          if (!answered) refuse(502, errorMessage(e));
          else socket.destroy();
        });
        conn.on("close", (hadError) => {
          clearTimeout(timer);
          if (!answered) return refuse(502, `${o.name} closed the connection`);
          if (hadError) return void socket.destroy();
          // What upstream sent last is still going out: the client gets it, then the end.
          socket.end();
          setTimeout(() => socket.destroy(), CLOSE_GRACE_MS).unref();
        });
      } catch (e) {
        refuse(502, errorMessage(e));
      }
    },
    (e: unknown) => refuse(502, errorMessage(e)),
  );
}
