/**
 * Where a reverse proxy (./proxy-request.ts, ./proxy-upgrade.ts) sends a request, and the bounds
 * and answers every relay shares: a TCP address (over TLS when it says so) or a unix socket, the
 * wait for a connection (a request's), the idle bound of an open one, and the body of the proxy's
 * own refusal. A request or a raw connection to an upstream is made here (requestTo, connectTo),
 * so every relay reaches a TLS upstream alike: its certificate verified always, against the
 * upstream's trust, for its host (a name: the name it serves, sent as SNI; an IP address: its
 * certificate's subjectAltName IP).
 */
import { request as httpRequest } from "node:http";
import type { ClientRequest, RequestOptions } from "node:http";
import { request as httpsRequest } from "node:https";
import { connect as netConnect, isIP } from "node:net";
import type { Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import type { ConnectionOptions, SecureContext } from "node:tls";

/** TLS to upstream: the CAs its certificate must chain to (null: the ones Node trusts by default). */
export interface UpstreamTls {
  trust: SecureContext | null;
}

/** A TCP address (over TLS when `tls` is given) or a unix socket. */
export type Upstream = { host: string; port: number; tls?: UpstreamTls } | { socketPath: string };

/** A "host:port" address (the last colon splits: an IPv6 host keeps its own). */
export function upstreamAt(addr: string): Upstream {
  const i = addr.lastIndexOf(":");
  return { host: addr.slice(0, i), port: Number(addr.slice(i + 1)) };
}

/** The TLS options of a connection to `host`: verified, against `tls.trust`, for `host`. */
function tlsOptions(host: string, tls: UpstreamTls): ConnectionOptions {
  return {
    rejectUnauthorized: true,
    // SNI is for names only (an IP address as servername is refused by RFC 6066): an IP is
    // checked against the certificate's subjectAltName IP by its host.
    ...(isIP(host) === 0 ? { servername: host } : {}),
    ...(tls.trust ? { secureContext: tls.trust } : {}),
  };
}

/** Whether a connection to `to` is usable only after its TLS handshake. */
export const overTls = (to: Upstream): boolean => "host" in to && to.tls !== undefined;

/** The event a new socket to `to` emits once requests may go on it (the handshake done, for TLS). */
export const readyEvent = (to: Upstream): "connect" | "secureConnect" =>
  overTls(to) ? "secureConnect" : "connect";

/** An HTTP(S) request to `to` with `o` (method, path, headers, agent ...). */
export function requestTo(
  to: Upstream,
  o: Omit<RequestOptions, "host" | "hostname" | "port" | "socketPath">,
): ClientRequest {
  if ("socketPath" in to) return httpRequest({ ...o, socketPath: to.socketPath });
  const addr = { host: to.host, port: to.port };
  return to.tls
    ? httpsRequest({ ...o, ...addr, ...tlsOptions(to.host, to.tls) })
    : httpRequest({ ...o, ...addr });
}

/** A raw connection to `to` (a TLS socket when it says so): write on it once readyEvent(to) came. */
export function connectTo(to: Upstream): Socket {
  if ("socketPath" in to) return netConnect({ path: to.socketPath });
  return to.tls
    ? tlsConnect({ host: to.host, port: to.port, ...tlsOptions(to.host, to.tls) })
    : netConnect({ host: to.host, port: to.port });
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
