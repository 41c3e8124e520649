/**
 * The operator's opening of the host's own addresses to sandboxes (FORKD_NET_HOST_ALLOW). By
 * default no sandbox reaches any address of the host (every address of every interface, those
 * added later, loopback, the slots' host ends) nor a port the host redirects elsewhere (DNAT,
 * as a container runtime publishes a port), whatever its egress policy says: a tenant's
 * allow-list, at creation or changed later (forkd's own API, E2B's updateNetwork), and an
 * admin's sandbox alike (its guest runs code nobody vetted). Only the operator, who runs the
 * daemon, opens host destinations, each as a CIDR with optional ports like an allow-list entry;
 * a sandbox then reaches one only where its own policy allows it too (egress `allow`, or a
 * `list` entry covering it). The daemon's own TCP ports stay closed whatever this says.
 */
import { ForkdError } from "../util/index.js";
import { MAX_ALLOW_RULES, parseCidr, parsePortSpec } from "./policy.js";
import type { AllowRule } from "./policy.js";

/**
 * Parses FORKD_NET_HOST_ALLOW: entries separated by spaces, each "CIDR[:PORTS]" (a bare address
 * is a /32; PORTS a comma list of ports and "lo-hi" ranges, TCP and UDP), e.g.
 * "10.0.0.5:3128 192.168.1.0/24:5432,8000-8100". Unset or empty: nothing is open.
 */
export function parseHostAllow(text: string | undefined): AllowRule[] {
  const entries = (text ?? "").split(/\s+/).filter((e) => e !== "");
  if (entries.length > MAX_ALLOW_RULES)
    throw bad(`at most ${MAX_ALLOW_RULES} entries (got ${entries.length})`);
  return entries.map((entry) => {
    const at = entry.indexOf(":");
    const cidr = parseCidr(at < 0 ? entry : entry.slice(0, at), "FORKD_NET_HOST_ALLOW").text;
    if (at < 0) return { cidr };
    const ports = entry.slice(at + 1).split(",");
    if (ports.some((p) => p === "")) throw bad(`${JSON.stringify(entry)}: an empty port`);
    return {
      cidr,
      ports: ports.map((p) => parsePortSpec(/^\d+$/.test(p) ? Number(p) : p, "FORKD_NET_HOST_ALLOW")),
    };
  });
}

const bad = (message: string): ForkdError =>
  new ForkdError("invalid_argument", `FORKD_NET_HOST_ALLOW: ${message}`);
