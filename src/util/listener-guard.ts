/**
 * What every listener of forkd does against connections that hold it without asking anything
 * (slowloris): connections bounded overall and per remote address (IPv6: per /64), the last
 * tenth of the overall bound kept for addresses that hold few, so one address (or a few) cannot
 * shut others out; and for HTTP, the headers of a request within a bound (checked every second,
 * not Node's default 30 s), an idle keep-alive connection closed, and a client error (a
 * malformed or timed-out request) answered and destroyed, never left half-open. One module for
 * the daemon's TCP listener (FORKD_LISTEN) and unix socket, E2B's listener, `forkd console` and
 * the exposed-port relays: httpOptions() for the server's creation, guard() once it exists (or
 * ConnectionGate.admit() in a raw TCP server's own connection handler).
 */
import type { Server as HttpServer, ServerOptions } from "node:http";
import type { Server, Socket } from "node:net";
import { isIPv6 } from "node:net";
import type { Duplex } from "node:stream";

export interface ListenerLimits {
  /** Connections at once, all addresses together. */
  maxConnections: number;
  /** Connections at once from one remote address (IPv6: one /64). */
  perAddress: number;
  /** A request's headers must be complete within this (HTTP only). */
  headersTimeoutMs: number;
  /** An idle keep-alive connection is closed after this (HTTP only). */
  keepAliveTimeoutMs: number;
}

export const DEFAULT_LIMITS: ListenerLimits = {
  maxConnections: 1024,
  // Generous: one client host driving hundreds of sandboxes (an evaluation harness, a gateway)
  // holds many connections; the reserve past nine tenths keeps room for other addresses.
  perAddress: 256,
  headersTimeoutMs: 15_000,
  keepAliveTimeoutMs: 5_000,
};

/** Past this share of maxConnections, an address holding REPLETE or more gets no more. */
const RESERVE_FROM = 0.9;
const REPLETE = 4;

/** The key connections are counted under: the address, an IPv6 one by its /64. */
export function addressKey(remote: string | undefined): string {
  if (remote === undefined || remote === "") return "local";
  const v4 = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(remote);
  if (v4) return v4[1]!;
  if (!isIPv6(remote)) return remote;
  // Expand "::" and keep the first four groups.
  const [head = "", tail = ""] = remote.split("::");
  const h = head === "" ? [] : head.split(":");
  const t = tail === "" ? [] : tail.split(":");
  const groups = remote.includes("::")
    ? [...h, ...Array<string>(8 - h.length - t.length).fill("0"), ...t]
    : h;
  return `${groups.slice(0, 4).join(":")}::/64`;
}

/** Counts open connections per address and says which to admit. */
export class ConnectionGate {
  private total = 0;
  private readonly byAddress = new Map<string, number>();

  constructor(private readonly limits: Pick<ListenerLimits, "maxConnections" | "perAddress">) {}

  /**
   * Whether `socket` may stay: if so it is counted until it closes; if not it is destroyed at
   * once (nothing written: a refused connection costs the listener nothing more).
   */
  admit(socket: Socket): boolean {
    const key = addressKey(socket.remoteAddress);
    const held = this.byAddress.get(key) ?? 0;
    const { maxConnections, perAddress } = this.limits;
    const crowded = this.total >= Math.floor(maxConnections * RESERVE_FROM) && held >= REPLETE;
    if (this.total >= maxConnections || held >= perAddress || crowded) {
      socket.destroy();
      return false;
    }
    this.total++;
    this.byAddress.set(key, held + 1);
    socket.once("close", () => {
      this.total--;
      const n = (this.byAddress.get(key) ?? 1) - 1;
      if (n <= 0) this.byAddress.delete(key);
      else this.byAddress.set(key, n);
    });
    return true;
  }

  /** Connections held now (all, or from one address). */
  held(remote?: string): number {
    return remote === undefined ? this.total : (this.byAddress.get(addressKey(remote)) ?? 0);
  }
}

/** Options for http(s).createServer: the timeouts, checked every second. */
export function httpOptions(l: ListenerLimits): ServerOptions {
  return {
    headersTimeout: l.headersTimeoutMs,
    // Long uploads and streams are bounded by the body limits and their own timeouts.
    requestTimeout: 0,
    keepAliveTimeout: l.keepAliveTimeoutMs,
    connectionsCheckingInterval: Math.max(50, Math.min(1_000, Math.floor(l.headersTimeoutMs / 4))),
  };
}

/**
 * Guards `server`: each connection is admitted by a ConnectionGate (before the server sees it:
 * a refused one never reaches HTTP or TLS); for an HTTP server also the timeouts (for one made
 * without httpOptions(), checked at Node's own interval) and client errors answered with a
 * status and destroyed (`reply`: the bytes to write, default a bare status line).
 */
export function guard(
  server: Server | HttpServer,
  l: ListenerLimits,
  reply?: (status: number) => string,
): ConnectionGate {
  const gate = new ConnectionGate(l);
  server.prependListener("connection", (socket: Socket) => void gate.admit(socket));
  if ("headersTimeout" in server) {
    server.headersTimeout = l.headersTimeoutMs;
    server.requestTimeout = 0;
    server.keepAliveTimeout = l.keepAliveTimeoutMs;
    server.removeAllListeners("clientError");
    server.on("clientError", (err: NodeJS.ErrnoException, socket: Duplex) => {
      const status =
        err.code === "HPE_HEADER_OVERFLOW" ? 431 : err.code === "ERR_HTTP_REQUEST_TIMEOUT" ? 408 : 400;
      closeWith(socket, err.code === "ECONNRESET" ? null : (reply?.(status) ?? bare(status)));
    });
  }
  return gate;
}

const bare = (status: number): string =>
  `HTTP/1.1 ${status} ${status === 431 ? "Request Header Fields Too Large" : status === 408 ? "Request Timeout" : "Bad Request"}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n`;

/** Writes `data` (if it can) and destroys the socket: never left open waiting for the peer. */
export function closeWith(socket: Duplex, data: string | null): void {
  if (data === null || !socket.writable) {
    socket.destroy();
    return;
  }
  socket.write(data, () => socket.destroy());
  // A peer that reads nothing does not hold it either.
  setTimeout(() => socket.destroy(), 1_000).unref();
}
