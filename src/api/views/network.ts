/** A sandbox's network as the API shows it (schema SandboxNetwork), from its record. */
import type { z } from "zod";
import type { Egress } from "../../net/index.js";
import type { NetworkRecord } from "../../net/index.js";
import type * as schemas from "../contract/schemas.js";

export type NetworkView = z.infer<typeof schemas.SandboxNetwork>;

/** The view of `r` (absent: a record from before networking, none); ports only while `running`. */
export function networkView(r: NetworkRecord | undefined, running: boolean): NetworkView {
  if (!r) return { mode: "none", guest_ip: null, egress: null, ports: [] };
  return {
    mode: r.mode,
    guest_ip: r.guestIp,
    egress: r.mode === "none" ? null : egressView(r.egress),
    ports: running
      ? Object.entries(r.ports)
          .map(([port, host]) => ({ port: Number(port), host }))
          .sort((a, b) => a.port - b.port)
      : [],
  };
}

/** An egress policy as the API shows it: port ranges as "lo-hi", single ports as numbers. */
export function egressView(e: Egress): NonNullable<NetworkView["egress"]> {
  return {
    mode: e.mode,
    allow: e.allow.map((r) =>
      r.ports
        ? { cidr: r.cidr, ports: r.ports.map(([lo, hi]) => (lo === hi ? lo : `${lo}-${hi}`)) }
        : { cidr: r.cidr },
    ),
    dns: e.dns,
  };
}
