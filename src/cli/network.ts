/** `forkd fork` flags → the API's network request (the daemon validates it). */

export interface NetworkFlags {
  net?: string;
  egress?: string;
  allow?: string[];
  dns?: boolean;
  expose?: string[];
}

/** "CIDR[:PORTS]" with PORTS a comma list of ports and "lo-hi" ranges: one allow-list entry. */
export function allowEntry(s: string): { cidr: string; ports?: Array<number | string> } {
  const [cidr = "", ports] = s.split(":", 2);
  if (ports === undefined || ports === "") return { cidr };
  return { cidr, ports: ports.split(",").map((p) => (/^\d+$/.test(p) ? Number(p) : p)) };
}

/** The request body's `network`, or undefined when no flag asks for one. */
export function networkFromFlags(o: NetworkFlags): Record<string, unknown> | undefined {
  const allow = (o.allow ?? []).map(allowEntry);
  const egressMode = o.egress ?? (allow.length > 0 ? "list" : undefined);
  if (!o.net && !egressMode && o.expose === undefined && o.dns === undefined) return undefined;
  const egress =
    egressMode !== undefined || o.dns !== undefined
      ? {
          mode: egressMode ?? "allow",
          ...(allow.length > 0 ? { allow } : {}),
          ...(o.dns !== undefined ? { dns: o.dns } : {}),
        }
      : undefined;
  return {
    mode: o.net ?? "netns",
    ...(egress ? { egress } : {}),
    ...(o.expose ? { expose: o.expose.map(Number) } : {}),
  };
}
