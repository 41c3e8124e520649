/**
 * API tokens for TCP callers. The daemon hands a token out once (`forkd token create`) and keeps
 * only its sha256 in the tokens file, with the tenant it belongs to and its scope:
 *
 *   { "format": 1, "tokens": [ { "id": "tok-…", "tenant": "alice", "scope": "tenant",
 *                                "sha256": "<hex>", "created": "<iso>", "max_sandboxes": 50 } ] }
 *
 * A token made for E2B's SDKs (`kind: "e2b"`) is `e2b_` + hex, the form those SDKs accept as an
 * API key; it is kept and scoped like every other token.
 *
 * Where they are kept is a backing's (TokenBacking): the tokens file (./tokens-file.ts) or, in a
 * cluster, etcd (src/cluster/cluster-tokens.ts).
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { ForkdError } from "../util/index.js";
import { TENANT_RE } from "../util/index.js";
import type { BuildCaps } from "./caller.js";
import type { Caller } from "./caller.js";
import { OpenStreams } from "./open-streams.js";
import { FileTokens } from "./tokens-file.js";
import { MAX_TOKENS, TOKEN_ID_RE, TenantName, TokenScope } from "./token-entry.js";
import type { TokenBacking, TokenEntry } from "./token-entry.js";

export { TOKEN_ID_RE, TenantName, TokenScope };
export type { TokenEntry };

export { TENANT_RE };
/** A bearer token longer than this is refused before it is hashed. */
const MAX_PRESENTED = 512;
export const MIN_TOKEN = 32;
/** The API key form E2B's JS SDK accepts (it refuses others). */
export const E2B_KEY_RE = /^e2b_[0-9a-f]+$/;

/** What is shown of a token: everything but its hash. */
export type TokenView = Omit<TokenEntry, "sha256">;

const sha256 = (s: string): Buffer => createHash("sha256").update(s, "utf8").digest();
const B32 = "abcdefghijklmnopqrstuvwxyz234567";

/** Why `token` is not fit to guard a TCP listener, or null when it is. */
export function weakTokenReason(token: string): string | null {
  if (token.length < MIN_TOKEN) return `shorter than ${MIN_TOKEN} characters`;
  if (token.length > MAX_PRESENTED) return `longer than ${MAX_PRESENTED} characters`;
  if (!/^[\x21-\x7e]+$/.test(token)) return "not printable ASCII without spaces";
  if (new Set(token).size < 10) return "fewer than 10 distinct characters (not random)";
  if (/change.?me|placeholder|your.?token|example|password|secret|xxxx|1234567|abcdefg/i.test(token))
    return "looks like a placeholder";
  return null;
}

/** The token of an `Authorization: Bearer <token>` header, or null. */
export function bearerOf(header: string | undefined): string | null {
  if (!header) return null;
  const m = /^Bearer +([\x21-\x7e]+) *$/i.exec(header);
  if (!m || m[1] === undefined || m[1].length > MAX_PRESENTED) return null;
  return m[1];
}

/** Constant-time equality of two secrets (compared as sha256 digests: equal length always). */
export function secretEquals(a: string, b: string): boolean {
  return timingSafeEqual(sha256(a), sha256(b));
}

/** The credential a token of the file is (Caller.credential, ./open-streams.ts). */
export const credentialOf = (id: string): string => `token:${id}`;

/**
 * The tokens: loaded at start (and on SIGHUP), changed only through create/revoke (or, in a
 * cluster, by another member: followed). A token revoked (or gone from the store at a reload,
 * or changed there) ends at once everything it opened (`opened`).
 */
export class TokenStore {
  /** What callers opened with each token, ended when it is revoked. */
  readonly opened = new OpenStreams();
  private entries: TokenEntry[] = [];
  /** sha256 (hex) → entry. */
  private byHash = new Map<string, TokenEntry>();
  private writing: Promise<unknown> = Promise.resolve();
  readonly backing: TokenBacking;

  /** A tokens file's path (this daemon's own), or another backing (the cluster's). */
  constructor(where: string | TokenBacking) {
    this.backing = typeof where === "string" ? new FileTokens(where) : where;
    this.backing.follow?.((entries) => this.set(entries));
  }

  get size(): number {
    return this.entries.length;
  }

  /** Settles once changes made elsewhere before now are known here (a cluster's; bounded). */
  async catchUp(): Promise<void> {
    await this.backing.catchUp?.();
  }

  /** (Re)reads the store. Throws on a bad store, keeping the old state. */
  async load(): Promise<void> {
    this.set(await this.backing.load());
  }

  private set(entries: TokenEntry[]): void {
    const before = this.entries;
    this.entries = entries;
    this.byHash = new Map(entries.map((e) => [e.sha256, e]));
    // A token no longer there, or no longer the same (its tenant, scope or secret edited by
    // hand), is revoked: what it opened ends.
    const now = new Map(entries.map((e) => [e.id, e]));
    for (const old of before) {
      const e = now.get(old.id);
      const same =
        e !== undefined && e.sha256 === old.sha256 && e.tenant === old.tenant && e.scope === old.scope;
      if (!same) this.opened.revoke(credentialOf(old.id));
    }
  }

  list(): TokenView[] {
    return this.entries.map(({ sha256: _h, ...view }) => view);
  }

  /**
   * The entry whose token this is, or null. The presented token is hashed first, so the lookup
   * only ever compares digests: timing can tell an attacker at most how much of sha256(guess)
   * matches a stored digest, which does not help find a token. The final comparison is
   * constant-time anyway.
   */
  find(presented: string): TokenEntry | null {
    const digest = sha256(presented);
    const e = this.byHash.get(digest.toString("hex"));
    if (!e) return null;
    return timingSafeEqual(digest, Buffer.from(e.sha256, "hex")) ? e : null;
  }

  /** The entry with this id (not its secret: for sessions bound to a token), or null. */
  byId(id: string): TokenEntry | null {
    return this.entries.find((e) => e.id === id) ?? null;
  }

  /** Creates a token; the secret is returned here and never again. */
  async create(o: {
    tenant: string;
    scope: "admin" | "tenant";
    maxSandboxes?: number;
    /** The token's own build caps (absent: the operator's defaults). */
    caps?: Partial<BuildCaps>;
    /** An E2B API key: `e2b_` + 64 hex digits. */
    e2b?: boolean;
  }): Promise<{ token: string; entry: TokenView }> {
    return this.serial(async () => {
      if (this.entries.length >= MAX_TOKENS)
        throw new ForkdError("resource_exhausted", `at most ${MAX_TOKENS} tokens`);
      const token = o.e2b
        ? "e2b_" + randomBytes(32).toString("hex")
        : "fkd_" + randomBytes(32).toString("base64url");
      const id =
        "tok-" +
        Array.from(randomBytes(12), (b) => B32[b & 31])
          .join("")
          .slice(0, 12);
      const entry: TokenEntry = {
        id,
        tenant: TenantName.parse(o.tenant),
        scope: o.scope,
        sha256: sha256(token).toString("hex"),
        created: new Date().toISOString(),
        ...(o.maxSandboxes !== undefined ? { max_sandboxes: o.maxSandboxes } : {}),
        ...(o.caps?.memoryMiB !== undefined ? { max_memory_mib: o.caps.memoryMiB } : {}),
        ...(o.caps?.vcpus !== undefined ? { max_vcpus: o.caps.vcpus } : {}),
        ...(o.caps?.buildDiskMiB !== undefined ? { max_build_disk_mib: o.caps.buildDiskMiB } : {}),
        ...(o.e2b ? { kind: "e2b" as const } : {}),
      };
      await this.backing.add(entry, this.entries);
      this.set([...this.entries.filter((t) => t.id !== entry.id), entry]);
      const { sha256: _h, ...view } = entry;
      return { token, entry: view };
    });
  }

  async revoke(id: string): Promise<TokenView> {
    return this.serial(async () => {
      const e = this.entries.find((t) => t.id === id);
      if (!e) throw new ForkdError("not_found", `no token ${id}`, { id });
      await this.backing.remove(e, this.entries);
      this.set(this.entries.filter((t) => t.id !== e.id));
      const { sha256: _h, ...view } = e;
      return view;
    });
  }

  /** Runs changes one at a time, so none is lost. */
  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.writing.then(fn, fn);
    this.writing = p.catch(() => undefined);
    return p;
  }
}

/** Turns a bearer header into a caller: FORKD_TOKEN is an admin, the file's tokens their entry. */
const ENV_ADMIN: Caller = {
  name: "admin",
  tenant: null,
  tokenId: null,
  limited: true,
  maxSandboxes: null,
  credential: "env-admin",
};

function callerOfEntry(entry: TokenEntry): Caller {
  const caps: Partial<BuildCaps> = {
    ...(entry.max_memory_mib !== undefined ? { memoryMiB: entry.max_memory_mib } : {}),
    ...(entry.max_vcpus !== undefined ? { vcpus: entry.max_vcpus } : {}),
    ...(entry.max_build_disk_mib !== undefined ? { buildDiskMiB: entry.max_build_disk_mib } : {}),
  };
  return {
    name: entry.tenant,
    tenant: entry.scope === "admin" ? null : entry.tenant,
    tokenId: entry.id,
    limited: true,
    maxSandboxes: entry.max_sandboxes ?? null,
    credential: credentialOf(entry.id),
    ...(Object.keys(caps).length > 0 ? { caps } : {}),
  };
}

export class Authenticator {
  constructor(
    readonly tokens: TokenStore,
    private readonly adminToken?: string,
  ) {}

  /** Whether any token at all would be accepted. */
  get hasTokens(): boolean {
    return this.adminToken !== undefined || this.tokens.size > 0;
  }

  /**
   * Before authenticate(): a bearer this member does not know may be a token made a moment ago
   * through another member of the cluster; this waits (bounded) until every token change made
   * before now is known here. Nothing to wait for with a known token, or with no bearer.
   */
  async fresh(header: string | undefined): Promise<void> {
    const presented = bearerOf(header);
    if (presented === null || this.tokens.find(presented)) return;
    if (this.adminToken !== undefined && secretEquals(presented, this.adminToken)) return;
    await this.tokens.catchUp();
  }

  authenticate(header: string | undefined): Caller | null {
    const presented = bearerOf(header);
    if (presented === null) return null;
    // Both checks always run, so the time taken does not tell which kind of token matched.
    const admin = this.adminToken !== undefined && secretEquals(presented, this.adminToken);
    const entry = this.tokens.find(presented);
    if (admin) return ENV_ADMIN;
    if (!entry) return null;
    return callerOfEntry(entry);
  }

  /**
   * What a console session opened by `c` stands for (src/api/routes/console-session.ts): its
   * token's id, re-checked on every request by sessionCaller().
   */
  static sessionSubject(c: Caller): string {
    return c.tokenId === null ? "env-admin" : `token:${c.tokenId}`;
  }

  /**
   * The credentials whose callers see tenant `tenant`'s sandboxes (null: an admin's): FORKD_TOKEN,
   * the admin tokens and, for a tenant, its own tokens.
   */
  credentialsSeeing(tenant: string | null): string[] {
    const out = this.adminToken !== undefined ? ["env-admin"] : [];
    for (const e of this.tokens.list())
      if (e.scope === "admin" || (tenant !== null && e.tenant === tenant)) out.push(credentialOf(e.id));
    return out;
  }

  /**
   * The caller of a session's subject (a credential: Caller.credential) now; null once its token
   * is revoked (or FORKD_TOKEN unset).
   */
  sessionCaller(subject: string): Caller | null {
    if (subject === "env-admin") return this.adminToken !== undefined ? ENV_ADMIN : null;
    if (!subject.startsWith("token:")) return null;
    const entry = this.tokens.byId(subject.slice("token:".length));
    return entry ? callerOfEntry(entry) : null;
  }
}
