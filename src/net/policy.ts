/**
 * What a sandbox's network is allowed to do, parsed and checked once at the edge: the mode
 * (none, user, netns), the egress policy (deny, allow, or a list of CIDRs with optional ports),
 * whether DNS is answered, and which guest ports are exposed on the host. IPv4 only: the guest
 * has no IPv6 (guest/agent/src/net.c) and the host drops it.
 */
import { ForkdError } from "../util/index.js";
import { intToIp, ipToInt, prefixMask } from "./guest.js";

export type NetMode = "none" | "user" | "netns";
export type EgressMode = "deny" | "allow" | "list";

/** One allow-list entry: a network and, optionally, the TCP/UDP ports (inclusive ranges) on it. */
export interface AllowRule {
  /** Normalised "a.b.c.d/n". */
  cidr: string;
  /** Absent: every protocol and port. */
  ports?: Array<[number, number]>;
}

export interface Egress {
  mode: EgressMode;
  /** Only for `list`. */
  allow: AllowRule[];
  /** Whether the guest's resolver (10.0.2.3) answers. */
  dns: boolean;
}

export interface NetworkSpec {
  mode: NetMode;
  egress: Egress;
  /** Guest TCP ports reachable from the host. */
  expose: number[];
}

export const MAX_ALLOW_RULES = 64;
export const MAX_PORTS_PER_RULE = 32;
export const MAX_EXPOSE = 16;

/** The network of a sandbox that asks for none. */
export const NO_NETWORK: NetworkSpec = {
  mode: "none",
  egress: { mode: "deny", allow: [], dns: false },
  expose: [],
};

const bad = (field: string, message: string): ForkdError =>
  new ForkdError("invalid_argument", message, { field });

const OCTET = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$/;

/** Parses a dotted-quad IPv4 address (no leading zeros, no shorthand); null if it is not one. */
export function parseIpv4(s: string): number | null {
  const parts = s.split(".");
  if (parts.length !== 4 || !parts.every((p) => OCTET.test(p))) return null;
  return ipToInt(s);
}

/**
 * Parses "a.b.c.d/n" (or a bare address, /32). The address must be the network's first one:
 * "10.1.2.3/8" is refused rather than silently widened or narrowed.
 */
export function parseCidr(s: string, field = "cidr"): { addr: number; prefix: number; text: string } {
  if (typeof s !== "string" || s.length > 18)
    throw bad(field, `${field}: not an IPv4 CIDR: ${JSON.stringify(s)}`);
  const [ip = "", len, ...rest] = s.split("/");
  const addr = parseIpv4(ip);
  const prefix = len === undefined ? 32 : /^(3[0-2]|[12]?\d)$/.test(len) ? Number(len) : NaN;
  if (addr === null || rest.length > 0 || !Number.isInteger(prefix)) {
    throw bad(field, `${field}: not an IPv4 CIDR: ${JSON.stringify(s)}`);
  }
  const net = (addr & prefixMask(prefix)) >>> 0;
  if (net !== addr) {
    throw bad(
      field,
      `${field}: ${s} has host bits set (the network is ${intToIp(net)}/${prefix}; a single address is ${ip}/32)`,
    );
  }
  return { addr, prefix, text: `${ip}/${prefix}` };
}

/** Whether `addr` lies in `cidr` (both already parsed). */
export const cidrContains = (cidr: { addr: number; prefix: number }, addr: number): boolean =>
  (addr & prefixMask(cidr.prefix)) >>> 0 === cidr.addr;

/** A port (1-65535) or an inclusive range "lo-hi". */
export function parsePortSpec(p: number | string, field = "ports"): [number, number] {
  const isPort = (n: number) => Number.isInteger(n) && n >= 1 && n <= 65535;
  if (typeof p === "number") {
    if (!isPort(p)) throw bad(field, `${field}: ${p} is not a port (1-65535)`);
    return [p, p];
  }
  const m = /^(\d{1,5})-(\d{1,5})$/.exec(p);
  const lo = Number(m?.[1]);
  const hi = Number(m?.[2]);
  if (!m || !isPort(lo) || !isPort(hi) || lo > hi) {
    throw bad(field, `${field}: ${JSON.stringify(p)} is not a port or a range "lo-hi" within 1-65535`);
  }
  return [lo, hi];
}

/** What the API accepts (already shape-checked by the contract's schema). */
export interface NetworkInput {
  mode?: NetMode;
  egress?: {
    mode: EgressMode;
    allow?: Array<{ cidr: string; ports?: Array<number | string> }>;
    dns?: boolean;
  };
  expose?: number[];
}

/**
 * Checks and normalises a spawn's network request. Defaults: mode `none`; with a network,
 * egress `allow` (the host and sibling sandboxes stay unreachable whatever the policy); DNS on
 * unless egress is `deny` (where it cannot be on) or a `list` (where it is off unless asked).
 */
export function parseNetwork(input: NetworkInput | undefined): NetworkSpec {
  if (!input) return NO_NETWORK;
  const mode = input.mode ?? "none";
  const expose = [...new Set(input.expose ?? [])];
  if (expose.length > MAX_EXPOSE) throw bad("network.expose", `at most ${MAX_EXPOSE} exposed ports`);
  for (const p of expose) parsePortSpec(p, "network.expose");
  if (mode === "none") {
    if (input.egress && input.egress.mode !== "deny") {
      throw bad("network.egress", `network mode "none" has no egress; choose mode "user" or "netns"`);
    }
    if (expose.length > 0) throw bad("network.expose", `network mode "none" cannot expose ports`);
    return NO_NETWORK;
  }
  const e = input.egress ?? { mode: "allow" };
  const allowIn = e.allow ?? [];
  if (e.mode !== "list" && allowIn.length > 0) {
    throw bad("network.egress.allow", `egress.allow is only for egress mode "list"`);
  }
  if (allowIn.length > MAX_ALLOW_RULES) {
    throw bad("network.egress.allow", `at most ${MAX_ALLOW_RULES} allow-list entries`);
  }
  if (e.mode === "deny" && e.dns === true) {
    throw bad("network.egress.dns", `egress "deny" answers no DNS; use "list" with dns: true`);
  }
  if (e.mode === "list" && allowIn.length === 0 && e.dns !== true) {
    throw bad("network.egress.allow", `egress "list" needs at least one entry (or dns: true)`);
  }
  const allow: AllowRule[] = allowIn.map((r, i) => {
    const field = `network.egress.allow[${i}]`;
    const cidr = parseCidr(r.cidr, `${field}.cidr`).text;
    if (r.ports === undefined) return { cidr };
    if (r.ports.length === 0 || r.ports.length > MAX_PORTS_PER_RULE) {
      throw bad(
        `${field}.ports`,
        `${field}.ports: 1 to ${MAX_PORTS_PER_RULE} ports or ranges (omit it for all)`,
      );
    }
    return { cidr, ports: r.ports.map((p) => parsePortSpec(p, `${field}.ports`)) };
  });
  const dns = e.mode === "deny" ? false : (e.dns ?? e.mode === "allow");
  return { mode, egress: { mode: e.mode, allow, dns }, expose: expose.sort((a, b) => a - b) };
}
