/**
 * What of a request's and a reply's headers a reverse proxy (./proxy-request.ts,
 * ./proxy-upgrade.ts) passes on. Never forwarded either way: the hop-by-hop headers (the fixed
 * list and every header the Connection header names, RFC 9110 7.6.1). Never forwarded upstream:
 * this daemon's own credentials, whatever door they came in by (X-Access-Token, X-API-Key, the
 * web console's X-Forkd-Console and X-Forkd-Console-Key, and its session cookies), unless the
 * door names one it passes (`pass`: a cluster's gateway hands E2B's X-API-Key and X-Access-Token
 * to the node that checks them). What else a door keeps back (its routing headers, an
 * Authorization that is ours) its `keep` filter says.
 */
import type { IncomingHttpHeaders, IncomingMessage } from "node:http";
import { COOKIE as CONSOLE_COOKIE } from "../access/index.js";

/** Hop-by-hop headers: the proxy's own connection's, neither forwarded nor returned. */
export const HOP_BY_HOP: ReadonlySet<string> = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "transfer-encoding",
  "upgrade",
  "te",
  "trailer",
]);

/** Headers that carry a credential of this daemon: never forwarded upstream by any proxy. */
const CREDENTIALS: ReadonlySet<string> = new Set([
  "x-access-token",
  "x-api-key",
  "x-forkd-console",
  "x-forkd-console-key",
]);

/**
 * A door's own rule for one header (name in lower case): the value to send, or null to keep it
 * back. It is asked only of what the common rules above let through.
 */
export type HeaderFilter = (name: string, value: string) => string | null;

/** Every header of `h` that is named in its Connection header (lower case). */
export function connectionNamed(h: IncomingHttpHeaders): Set<string> {
  const c: string | string[] | undefined = h.connection;
  const values: string[] = Array.isArray(c) ? c : c === undefined ? [] : [c];
  const out = new Set<string>();
  for (const v of values)
    for (const n of v.split(",")) {
      const name = n.trim().toLowerCase();
      if (name !== "") out.add(name);
    }
  return out;
}

/** A Cookie header less the console's session cookies (null when nothing is left). */
export function withoutConsoleCookies(value: string): string | null {
  const kept = value
    .split(";")
    .map((p) => p.trim())
    .filter((p) => {
      if (p === "") return false;
      const eq = p.indexOf("=");
      const n = (eq < 0 ? p : p.slice(0, eq)).trim();
      return n !== CONSOLE_COOKIE && !n.startsWith(`${CONSOLE_COOKIE}_`);
    });
  return kept.length === 0 ? null : kept.join("; ");
}

/** Credential headers (lower case) a door forwards upstream as they came (default: none). */
export type PassedCredentials = ReadonlySet<string>;
const NONE: PassedCredentials = new Set();

/**
 * What reaches upstream of request header `name` (lower case), `value`: null for a hop-by-hop
 * header (also one the Connection header named: `hop`), a credential of ours (but those `pass`
 * names), or what `keep` refuses; a Cookie goes without the console's cookies.
 */
export function upstreamHeader(
  name: string,
  value: string,
  hop: ReadonlySet<string>,
  keep: HeaderFilter,
  pass: PassedCredentials = NONE,
): string | null {
  if (HOP_BY_HOP.has(name) || hop.has(name) || (CREDENTIALS.has(name) && !pass.has(name))) return null;
  const v = name === "cookie" ? withoutConsoleCookies(value) : value;
  return v === null ? null : keep(name, v);
}

/** Applies `one` to every value of `h`, keeping what it returns (a repeated header: each value). */
function filtered(h: IncomingHttpHeaders, one: (name: string, value: string) => string | null) {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(h)) {
    if (v === undefined) continue;
    if (Array.isArray(v)) {
      const kept = v.flatMap((x) => one(k, x) ?? []);
      if (kept.length > 0) out[k] = kept;
    } else {
      const x = one(k, v);
      if (x !== null) out[k] = x;
    }
  }
  return out;
}

/** The headers of a request as they go upstream, then `set` (which replaces what it names). */
export function upstreamHeaders(
  h: IncomingHttpHeaders,
  keep: HeaderFilter,
  set: Record<string, string> = {},
  pass: PassedCredentials = NONE,
): Record<string, string | string[]> {
  const hop = connectionNamed(h);
  return { ...filtered(h, (k, v) => upstreamHeader(k, v, hop, keep, pass)), ...set };
}

/** The headers of upstream's reply as they go to the client: no hop-by-hop, nothing `keep` refuses. */
export function replyHeaders(h: IncomingHttpHeaders, keep: HeaderFilter): Record<string, string | string[]> {
  const hop = connectionNamed(h);
  return filtered(h, (k, v) => (HOP_BY_HOP.has(k) || hop.has(k) ? null : keep(k, v)));
}

/**
 * An upgrade's request head as it goes upstream: names, order and repeats kept as sent, its
 * Connection and Upgrade headers as they are (they are what an upgrade is), every other header
 * as upstreamHeader() says, then `set` (which replaces what it names). CR and LF are removed
 * from values (node's parser already refuses them; this is the last guard of a raw write).
 */
export function upgradeHead(
  req: IncomingMessage,
  keep: HeaderFilter,
  set: Record<string, string> = {},
  pass: PassedCredentials = NONE,
): string {
  let head = `${req.method ?? "GET"} ${req.url ?? "/"} HTTP/1.1\r\n`;
  const h = req.rawHeaders;
  const replaced = new Set(Object.keys(set));
  // The names an upgrade's Connection header carries (`Upgrade`) are not hop-by-hop here.
  const hop = new Set([...connectionNamed(req.headers)].filter((n) => n !== "upgrade" && n !== "connection"));
  for (let i = 0; i + 1 < h.length; i += 2) {
    const name = h[i]!;
    const lower = name.toLowerCase();
    if (replaced.has(lower)) continue;
    const value =
      lower === "connection" || lower === "upgrade"
        ? h[i + 1]!
        : upstreamHeader(lower, h[i + 1]!, hop, keep, pass);
    if (value === null) continue;
    head += `${name}: ${value.replace(/[\r\n]/g, "")}\r\n`;
  }
  for (const [k, v] of Object.entries(set)) head += `${k}: ${v.replace(/[\r\n]/g, "")}\r\n`;
  return head + "\r\n";
}
