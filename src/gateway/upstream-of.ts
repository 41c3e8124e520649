/**
 * A node's address (its record's `api` or `e2b` URL: an http origin) as a relay's upstream
 * (src/http/upstream.ts). TLS to nodes is not relayed yet: an https origin is refused with a
 * clear reason (docs/cluster.md, "Gateway").
 */
import type { Upstream } from "../http/index.js";
import { ForkdError } from "../util/index.js";

export function upstreamOf(origin: string): Upstream {
  let u: URL;
  try {
    u = new URL(origin);
  } catch {
    throw new ForkdError("unavailable", `a node's address is not a URL: ${JSON.stringify(origin)}`);
  }
  if (u.protocol !== "http:")
    throw new ForkdError("unavailable", `the gateway relays to http nodes only, not ${u.protocol}//`);
  const host = u.hostname.startsWith("[") ? u.hostname.slice(1, -1) : u.hostname;
  return { host, port: u.port === "" ? 80 : Number(u.port) };
}
