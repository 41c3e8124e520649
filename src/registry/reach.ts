/**
 * Where a registry request may connect. The operator's own requests (the admin: the unix socket,
 * FORKD_TOKEN, an admin token) reach any address. A tenant's (the image of a snapshot creation, a
 * Dockerfile's FROM) reach only public addresses: never loopback, unspecified, link-local (the
 * cloud metadata service among them), private, unique-local or another non-public range
 * (util/ip.ts), nor an address of this host's own, unless the operator allows the registry by
 * name (FORKD_TENANT_REGISTRIES). The address checked is the one connected to: an IP literal
 * before the request, a name in the lookup its socket makes (a name that resolves to loopback,
 * or to another address the second time, is caught when it connects), on every hop (redirects,
 * a token service); and once before a pull whose image the cache could answer without a request.
 * A refusal is made before any connection, so it says nothing of what listens there.
 */
import { lookup as dnsLookup } from "node:dns/promises";
import type { LookupAddress } from "node:dns";
import { isIP } from "node:net";
import type { LookupFunction } from "node:net";
import { networkInterfaces } from "node:os";
import { ForkdError } from "../util/index.js";
import { ipBytes, ipKey, notPublic } from "../util/index.js";

/** Whose request it is: the operator's (any address) or a tenant's (public addresses only). */
export type Reach = "operator" | "tenant";

/** A registry the operator allows tenants whatever its address: a host, on one port or any. */
export interface AllowedHost {
  /** As a URL spells it: lowercase, an IPv6 address in brackets. */
  hostname: string;
  /** null: any port. */
  port: string | null;
}

/** What a tenant's requests are checked against. */
export interface TenantGuard {
  allowed: readonly AllowedHost[];
  /** The host's own addresses now (ipKey of each). */
  ownAddresses(): ReadonlySet<string>;
  /** Every address of a name (dns.lookup with `all`). */
  resolve(hostname: string): Promise<LookupAddress[]>;
}

export const TENANT_REGISTRIES_ENV = "FORKD_TENANT_REGISTRIES";

/** `host`, `host:port`, `[v6]`, `[v6]:port`, comma-separated; refuses what is none of these. */
export function parseAllowedHosts(text: string): AllowedHost[] {
  const out: AllowedHost[] = [];
  for (const raw of text.split(",")) {
    const entry = raw.trim().toLowerCase();
    if (entry === "") continue;
    const m = /^(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::(\d{1,5}))?$/.exec(entry);
    let hostname = "";
    try {
      if (m) hostname = new URL(`http://${m[1]}/`).hostname;
    } catch {
      hostname = "";
    }
    if (!m || hostname === "" || (m[2] !== undefined && (Number(m[2]) < 1 || Number(m[2]) > 65535))) {
      throw new ForkdError(
        "invalid_argument",
        `${TENANT_REGISTRIES_ENV}: ${JSON.stringify(raw.trim())} is not a registry host (host or host:port)`,
      );
    }
    out.push({ hostname, port: m[2] === undefined ? null : String(Number(m[2])) });
  }
  return out;
}

/** The host's own addresses, read afresh each time (interfaces come and go). */
export function hostAddresses(): ReadonlySet<string> {
  const out = new Set<string>();
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) {
      const b = ipBytes(a.address);
      if (b) out.add(ipKey(b));
    }
  }
  return out;
}

/** The guard of a daemon: the operator's list, the host's interfaces, the system's resolver. */
export function tenantGuard(allowed: readonly AllowedHost[]): TenantGuard {
  return {
    allowed,
    ownAddresses: hostAddresses,
    resolve: (hostname) => dnsLookup(hostname, { all: true }),
  };
}

const defaultPort = (url: URL): string => (url.protocol === "https:" ? "443" : "80");

/** Whether the operator allows `url`'s host to tenants by name. */
export function allowedByName(url: URL, g: TenantGuard): boolean {
  const port = url.port || defaultPort(url);
  return g.allowed.some((a) => a.hostname === url.hostname && (a.port === null || a.port === port));
}

/** Why `address` may not be reached by a tenant, or null. */
function why(address: string, g: TenantGuard): string | null {
  const b = ipBytes(address);
  return b ? notPublic(b, g.ownAddresses()) : "not an address";
}

/**
 * The refusal: the same whatever listens there (nothing was connected to), naming the host as the
 * tenant (or the registry's redirect) wrote it, not the address a name resolved to.
 */
export function refusal(url: URL, what: string): ForkdError {
  return new ForkdError(
    "forbidden",
    `${what}: refusing ${url.host}: a tenant's image may come only from a registry on a public address ` +
      `(not loopback, link-local, private or this host's own), or one the operator allows by name (${TENANT_REGISTRIES_ENV})`,
    { host: url.host },
  );
}

/** The error a refused URL gets (a registry's by default; another user, e.g. webhooks, says its own). */
export type Refuse = (url: URL, what: string) => ForkdError;

const hostOf = (url: URL): string => url.hostname.replace(/^\[|\]$/g, "");

/**
 * Before a tenant's request to `url`: an IP literal is checked now (a socket makes no lookup for
 * one), a name gets the lookup hook its socket must use; a host the operator allows gets none.
 */
export function connectCheck(
  url: URL,
  g: TenantGuard,
  what: string,
  refuse: Refuse = refusal,
): LookupFunction | undefined {
  if (allowedByName(url, g)) return undefined;
  const host = hostOf(url);
  if (isIP(host) !== 0) {
    if (why(host, g) !== null) throw refuse(url, what);
    return undefined;
  }
  return (hostname, options, callback) => {
    g.resolve(hostname).then(
      (addrs) => {
        const family = options.family === "IPv4" ? 4 : options.family === "IPv6" ? 6 : options.family;
        const list = family === 4 || family === 6 ? addrs.filter((a) => a.family === family) : addrs;
        const first = list[0];
        if (!first) {
          const e: NodeJS.ErrnoException = new Error(`getaddrinfo ENOTFOUND ${hostname}`);
          e.code = "ENOTFOUND";
          return callback(e, []);
        }
        // Every address, not only the one tried first: the socket may try them all.
        if (list.some((a) => why(a.address, g) !== null)) return callback(refuse(url, what), []);
        if (options.all) callback(null, list);
        else callback(null, first.address, first.family);
      },
      (e: unknown) => callback(e as NodeJS.ErrnoException, []),
    );
  };
}

/**
 * Refuses `url` now if a tenant may not reach it: for a pull the cache may answer without a
 * request (an image by digest), and to refuse before a streamed reply starts. The connection's
 * own check (connectCheck) still applies to every request made after.
 */
export async function assertReachable(
  url: URL,
  g: TenantGuard,
  what: string,
  refuse: Refuse = refusal,
): Promise<void> {
  if (allowedByName(url, g)) return;
  const host = hostOf(url);
  if (isIP(host) !== 0) {
    if (why(host, g) !== null) throw refuse(url, what);
    return;
  }
  let addrs: LookupAddress[] = [];
  let code: string | undefined;
  try {
    addrs = await g.resolve(host);
  } catch (e) {
    code = (e as NodeJS.ErrnoException).code;
  }
  if (addrs.length === 0) {
    throw new ForkdError(
      "unavailable",
      `${what}: cannot resolve ${url.hostname}${code ? ` (${code})` : ""}`,
      {
        host: url.host,
      },
    );
  }
  if (addrs.some((a) => why(a.address, g) !== null)) throw refuse(url, what);
}
