/** Who is calling the API: set once per request at the edge, read by scoping, limits and audit. */

/** What may be built for a tenant (the operator's caps, or a token's own: src/access/build-caps.ts). */
export interface BuildCaps {
  /** Guest RAM of a VM built for the tenant, MiB. */
  memoryMiB: number;
  vcpus: number;
  /** What one Dockerfile build's step layers may hold together, MiB. */
  buildDiskMiB: number;
}

export interface Caller {
  /** For the audit log: "local" (unix socket), "admin" (FORKD_TOKEN), else the token's tenant. */
  name: string;
  /** The tenant whose sandboxes and snapshots this caller sees; null: all of them (admin). */
  tenant: string | null;
  /** The token's id (null for the socket and for FORKD_TOKEN). */
  tokenId: string | null;
  /** Rate and concurrency limits apply (TCP callers; the socket is the trusted local admin). */
  limited: boolean;
  /** Sandboxes this caller's tenant may hold at once (null: only the daemon's limit). */
  maxSandboxes: number | null;
  /**
   * The credential it came by, as the token store names it (`token:<id>`, `env-admin`): what it
   * opens is ended when that is revoked (./open-streams.ts). Absent: none (the unix socket).
   */
  credential?: string;
  /**
   * The token's own caps on what is built for its tenant (build-caps.ts); absent ones (or all):
   * the operator's defaults. An admin has none.
   */
  caps?: Partial<BuildCaps>;
  /**
   * A gateway of the cluster reserved this request's sandboxes against the tenant's quota
   * across the cluster (its X-Forkd-Admitted header, checked against the cluster secret): the
   * node does not reserve them again. Absent: a node of a cluster reserves them itself.
   */
  admitted?: true;
}

/** The unix socket's caller: root on this host, the local admin. */
export const LOCAL: Caller = {
  name: "local",
  tenant: null,
  tokenId: null,
  limited: false,
  maxSandboxes: null,
};

/** No valid token (only public routes are served to it). */
export const ANONYMOUS: Caller = {
  name: "anonymous",
  tenant: "",
  tokenId: null,
  limited: true,
  maxSandboxes: 0,
};

export const isAdmin = (c: Caller): boolean => c.tenant === null;
