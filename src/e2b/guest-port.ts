/**
 * Any other port of an E2B sandbox: the guest's own service, proxied the way forkd's getHost
 * reaches it. The port is exposed on the host on first use (as `POST .../ports` would: kept in
 * the sandbox's record) and each request is relayed to that host address by the daemon's one
 * reverse proxy (../http/proxy-request.ts, an upgrade by ../http/proxy-upgrade.ts): bodies
 * streamed both ways, either side's hang-up ends the other, and a guest that does not answer is
 * a 502 as under E2B's proxy (an upgrade it does not answer in time, 504). What this file adds
 * is E2B's: which headers stay here (guestHeader) and the shape of E2B's refusal.
 */
import type { IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";
import type { E2bServices } from "./context.js";
import { proxyRequest } from "../http/index.js";
import { proxyUpgrade } from "../http/index.js";
import type { Upstream } from "../http/index.js";
import { upstreamAt } from "../http/index.js";
import { callerOfKey } from "./auth.js";
import type { SandboxPortHandler } from "./plane-target.js";

const CONNECT_TIMEOUT_MS = 10_000;
/** An upstream that sends nothing for this long is cut. */
const IDLE_TIMEOUT_MS = 10 * 60_000;

/**
 * What of a request's header `name` (lower case) reaches the guest, of what the proxy passes
 * (it keeps back hop-by-hop headers, this daemon's credential headers — X-Access-Token,
 * X-API-Key, the console's — and the console's session cookies: ../http/proxy-headers.ts):
 * `value`, or null when it stays here: E2B's own headers (E2b-Sandbox-*,
 * E2B-Traffic-Access-Token) and an `Authorization: Bearer` whose token is a credential of this
 * daemon (an API key or a sandbox's access token: it authenticated the request, or could
 * have). Any other Authorization (Basic, a token of the guest's own app) is the guest's.
 */
export function guestHeader(s: E2bServices, sandboxId: string, name: string, value: string): string | null {
  if (name.startsWith("e2b-")) return null;
  if (name === "authorization") return isOurBearer(s, sandboxId, value) ? null : value;
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

/** E2B's proxy's answer when the port answers nothing. */
function portClosed(t: { sandboxId: string; port: number }, upgrade: boolean) {
  return (code: 502 | 504, why: string) => ({
    body: JSON.stringify({
      code,
      message: `The sandbox is running but port ${t.port} is not open (${why})`,
      ...(upgrade ? {} : { sandboxId: t.sandboxId, port: t.port }),
    }),
  });
}

/** The host address of guest port `port`, exposing it first if it is not. */
async function hostAddress(s: E2bServices, id: string, port: number): Promise<Upstream> {
  const key = String(port);
  const now = s.sandboxes.get(id).record.network?.ports[key];
  if (now) return upstreamAt(now);
  const sb = await s.sandboxes.exposePort(id, port);
  const addr = sb.record.network?.ports[key];
  if (!addr) throw new Error("the port has no host address");
  return upstreamAt(addr);
}

export function guestPortHandler(s: E2bServices): SandboxPortHandler {
  return (req, res, t) =>
    proxyRequest(req, res, hostAddress(s, t.sandboxId, t.port), {
      name: "the guest",
      refusal: portClosed(t, false),
      connectTimeoutMs: CONNECT_TIMEOUT_MS,
      idleTimeoutMs: IDLE_TIMEOUT_MS,
      keep: (name, value) => guestHeader(s, t.sandboxId, name, value),
      keepReply: (name, value) => (name.startsWith("e2b-") ? null : value),
    });
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
 * guest (../http/proxy-upgrade.ts): a port that cannot be reached answers 502 on the raw
 * socket, a guest that does not start its reply in time 504; `o.done` is told once, when the
 * client's socket closes, the status the client got. Never throws.
 */
export function guestPortUpgrade(
  s: E2bServices,
  req: IncomingMessage,
  socket: Duplex,
  head: Buffer,
  t: { sandboxId: string; port: number },
  o: UpgradeOptions = {},
): void {
  proxyUpgrade(req, socket, head, hostAddress(s, t.sandboxId, t.port), {
    name: "the guest",
    refusal: portClosed(t, true),
    idleTimeoutMs: IDLE_TIMEOUT_MS,
    handshakeTimeoutMs: o.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS,
    keep: (name, value) => guestHeader(s, t.sandboxId, name, value),
    ...(o.done ? { done: o.done } : {}),
  });
}
