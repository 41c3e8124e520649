/**
 * Where a reverse proxy (./proxy-request.ts, ./proxy-upgrade.ts) sends a request, and the bounds
 * and answers every relay shares: a TCP address or a unix socket, the wait for a connection (a
 * request's), the idle bound of an open one, and the body of the proxy's own refusal.
 */

/** A TCP address or a unix socket. */
export type Upstream = { host: string; port: number } | { socketPath: string };

/** A "host:port" address (the last colon splits: an IPv6 host keeps its own). */
export function upstreamAt(addr: string): Upstream {
  const i = addr.lastIndexOf(":");
  return { host: addr.slice(0, i), port: Number(addr.slice(i + 1)) };
}

/** The default wait for a connection to upstream. */
export const CONNECT_TIMEOUT_MS = 10_000;

/** The proxy's own answer (no upstream reply to relay): its status and why, as the door words it. */
export interface Refusal {
  body: string;
  /** Default application/json. */
  contentType?: string;
}

export interface RelayOptions {
  /** Upstream as the proxy's messages name it ("the guest", "the daemon"). */
  name: string;
  /** The proxy's own answer when upstream gives none: 502 (unreachable, bad reply) or 504 (late). */
  refusal: (status: 502 | 504, why: string) => Refusal;
  /** An upstream connection that carries nothing either way for this long is cut (default: none). */
  idleTimeoutMs?: number;
}
