/**
 * E2B's network settings of a new sandbox onto forkd's (src/net/policy.ts). forkd's egress is an
 * allow list, so: internet access (the default) is egress `allow` in the host's best mode (netns,
 * else user; a host with neither gives no network); `allow_internet_access: false`, or a denyOut
 * of 0.0.0.0/0, denies everything but the allowOut entries (egress `list`, or no network when
 * there are none). allowOut and denyOut take IPv4 addresses and CIDRs; domain names, other deny
 * entries, transform rules and egress proxies are refused (400), never silently dropped.
 */
import { parseNetwork, NO_NETWORK } from "../../net/index.js";
import type { NetMode, NetworkSpec } from "../../net/index.js";
import { ForkdError } from "../../util/index.js";
import type { NetworkConfig } from "./schemas.js";

const bad = (message: string): ForkdError => new ForkdError("invalid_argument", message);

/** An allowOut/denyOut entry as a CIDR ("a.b.c.d" is /32). */
function cidrOf(entry: string, field: string): string {
  const t = entry.trim();
  if (!/^[0-9./]+$/.test(t))
    throw bad(
      `network.${field}: ${JSON.stringify(entry)}: only IPv4 addresses and CIDRs are supported (no domain names)`,
    );
  return t.includes("/") ? t : `${t}/32`;
}

export function networkOf(
  host: { netns: boolean; user: boolean },
  allowInternet: boolean | undefined,
  net: NetworkConfig | undefined,
): NetworkSpec {
  if (net?.rules && Object.keys(net.rules).length > 0)
    throw bad("network.rules (egress transforms) are not supported");
  if (net?.egressProxy !== undefined && net.egressProxy !== null)
    throw bad("network.egressProxy is not supported");
  const allow = (net?.allowOut ?? []).map((a) => cidrOf(a, "allowOut"));
  const deny = (net?.denyOut ?? []).map((d) => cidrOf(d, "denyOut"));
  const other = deny.filter((d) => d !== "0.0.0.0/0");
  if (other.length > 0)
    throw bad(
      `network.denyOut: only 0.0.0.0/0 is supported (forkd's egress is an allow list), not ${other.join(", ")}`,
    );
  const denyAll = allowInternet === false || deny.length > 0;
  const mode: NetMode = host.netns ? "netns" : host.user ? "user" : "none";
  if (mode === "none") return NO_NETWORK;
  if (!denyAll) return parseNetwork({ mode, egress: { mode: "allow" } });
  if (allow.length === 0) return NO_NETWORK;
  return parseNetwork({ mode, egress: { mode: "list", allow: allow.map((cidr) => ({ cidr })), dns: true } });
}
