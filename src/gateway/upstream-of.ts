/**
 * A node's address (its record's `api` or `e2b` URL: an http or https origin) as a relay's
 * upstream (src/http/upstream.ts): an https node is reached over TLS, its certificate verified
 * against `trust` (the gateway's FORKD_NODE_CA_FILE added to Node's CAs; null: Node's alone).
 * Any other scheme is refused with a clear reason (docs/cluster.md, "Gateway").
 */
import type { SecureContext } from "node:tls";
import type { Upstream } from "../http/index.js";
import { ForkdError } from "../util/index.js";

export function upstreamOf(origin: string, trust: SecureContext | null): Upstream {
  let u: URL;
  try {
    u = new URL(origin);
  } catch {
    throw new ForkdError("unavailable", `a node's address is not a URL: ${JSON.stringify(origin)}`);
  }
  if (u.protocol !== "http:" && u.protocol !== "https:")
    throw new ForkdError(
      "unavailable",
      `the gateway relays to http and https nodes only, not ${u.protocol}//`,
    );
  const host = u.hostname.startsWith("[") ? u.hostname.slice(1, -1) : u.hostname;
  if (u.protocol === "http:") return { host, port: u.port === "" ? 80 : Number(u.port) };
  return { host, port: u.port === "" ? 443 : Number(u.port), tls: { trust } };
}
