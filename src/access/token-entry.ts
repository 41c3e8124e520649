/**
 * One API token as it is stored (its sha256, never the token), the bounds of a store, and the
 * interface of where tokens are kept (TokenBacking: ./tokens-file.ts, or the cluster's etcd).
 */
import { z } from "zod";
import { ForkdError } from "../util/index.js";
import { TENANT_RE } from "../util/index.js";

export const TOKEN_ID_RE = /^tok-[a-z2-7]{12}$/;
export const MAX_TOKENS = 10_000;

export const TenantName = z
  .string()
  .regex(TENANT_RE, "tenant must match " + TENANT_RE.source)
  .describe("Tenant name: 1-64 characters, lowercase letters, digits, '_', '.', '-'.");
export const TokenScope = z
  .enum(["admin", "tenant"])
  .describe("admin: every sandbox and snapshot, token management and /metrics; tenant: its own only.");

export const TokenEntry = z.strictObject({
  id: z.string().regex(TOKEN_ID_RE),
  tenant: TenantName,
  scope: TokenScope,
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
  created: z.string(),
  /** Sandboxes this token's tenant may hold at once (absent: only the daemon's limit). */
  max_sandboxes: z.number().int().min(0).max(1_000_000).optional(),
  /** Caps on what is built for its tenant (access/build-caps.ts; absent: the operator's defaults). */
  max_memory_mib: z.number().int().min(0).max(65536).optional(),
  max_vcpus: z.number().int().min(0).max(32).optional(),
  max_build_disk_mib: z
    .number()
    .int()
    .min(0)
    .max(1 << 24)
    .optional(),
  /** "e2b": an E2B API key (`e2b_` + hex); absent: a forkd token (`fkd_` + base64url). */
  kind: z.literal("e2b").optional(),
});
export type TokenEntry = z.infer<typeof TokenEntry>;

/**
 * Where tokens are kept: the tokens file of one daemon (./tokens-file.ts), or the cluster's etcd
 * (src/cluster/cluster-tokens.ts), which every node and gateway shares. A backing only stores;
 * the TokenStore keeps the entries in memory, answers lookups from there and ends what a
 * revoked token opened.
 */
export interface TokenBacking {
  /** Where, for messages ("tokens file /x", "the cluster's etcd"). */
  readonly where: string;
  /** The entries now (checked: ids and hashes unique). Throws on a bad store, keeping the old state. */
  load(): Promise<TokenEntry[]>;
  /** Adds one; resolves once it is stored. */
  add(entry: TokenEntry, current: readonly TokenEntry[]): Promise<void>;
  /** Removes one; resolves once it is gone from the store. */
  remove(entry: TokenEntry, current: readonly TokenEntry[]): Promise<void>;
  /** Tells the store's changes made elsewhere (another node, a gateway): the whole set after each. */
  follow?(onEntries: (entries: TokenEntry[]) => void): void;
  /**
   * Settles once every change made elsewhere before the call has been told (bounded; never
   * rejects): a token just made on another member is then known here.
   */
  catchUp?(): Promise<void>;
}

/** Entries read from a store: the same id or hash twice is a bad store. */
export function checkUnique(entries: readonly TokenEntry[], where: string): void {
  const ids = new Set(entries.map((t) => t.id));
  const hashes = new Set(entries.map((t) => t.sha256));
  if (ids.size !== entries.length || hashes.size !== entries.length)
    throw new ForkdError("invalid_argument", `${where} repeats a token id or hash`);
}
