/**
 * The loopback console's proxy to the daemon's unix socket, by the daemon's one reverse proxy
 * (../http/proxy-request.ts; a WebSocket upgrade: ../http/proxy-upgrade.ts): a request (body
 * streamed) becomes the same request on the socket, its reply (NDJSON, SSE, bytes) goes back as
 * it comes, and either side hanging up at any byte ends the other. What this file adds is the
 * console's: no credential of the browser's reaches the daemon (it is called as the local admin:
 * every Cookie and Authorization stays here, beyond what the proxy keeps back everywhere: the
 * console's own headers, hop-by-hop), the Host is `localhost`, the bounds, and the console's
 * error envelope for a daemon that does not answer.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import type { HeaderFilter } from "../http/index.js";
import { proxyRequest as relayRequest } from "../http/index.js";
import { proxyUpgrade as relayUpgrade } from "../http/index.js";

/**
 * How long the daemon has to send a reply's headers (the body may then take as long as it
 * needs). Every daemon operation bounds its own waits; this only catches a daemon that hangs,
 * so it must outlast the longest call (a fork of hundreds, a branch of a large sandbox).
 */
const HEADERS_MS = 15 * 60_000;
/** A WebSocket upgrade (a terminal) is answered at once or not at all. */
const UPGRADE_MS = 60_000;

/** The browser's credentials, and its Host, stay here. */
const keep: HeaderFilter = (name, value) =>
  name === "cookie" || name === "authorization" || name === "host" ? null : value;

const common = {
  name: "the daemon",
  keep,
  set: { host: "localhost" },
  refusal: (_status: number, why: string) => ({
    body: JSON.stringify({
      error: { code: "unavailable", message: `the daemon did not answer: ${why}`, details: {} },
    }),
  }),
};

/** Proxies `req` to the daemon on `socketPath`, answering on `res`. Never throws. */
export function proxyRequest(socketPath: string, req: IncomingMessage, res: ServerResponse): void {
  relayRequest(req, res, { socketPath }, { ...common, headersTimeoutMs: HEADERS_MS });
}

/**
 * Proxies a WebSocket upgrade: the same upgrade on the socket, then the two connections spliced.
 * A refusal from the daemon (any status but 101) goes back as it is.
 */
export function proxyUpgrade(socketPath: string, req: IncomingMessage, client: Duplex, head: Buffer): void {
  relayUpgrade(req, client, head, { socketPath }, { ...common, handshakeTimeoutMs: UPGRADE_MS });
}
