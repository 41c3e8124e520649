/**
 * Who an envd request acts as, the way E2B's envd decides it: the `user` of a Basic
 * Authorization header (the SDK sends `user:`) or a `username` query parameter, else `user`;
 * the account is looked up in the guest's /etc/passwd (cached briefly per sandbox), and a
 * relative path resolves against its home. An image without a `user` account runs the default
 * as root (docs/e2b.md); a user named explicitly that the image lacks is refused.
 */
import { posix } from "node:path";
import type { AgentClient } from "../../agent/index.js";
import { ForkdError } from "../../util/index.js";

export interface Account {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

/** E2B's default user in its templates. */
export const DEFAULT_USER = "user";
const ROOT: Account = { name: "root", uid: 0, gid: 0, home: "/root" };
/** How long a sandbox's /etc/passwd is trusted (accounts rarely change under a running SDK). */
const TTL_MS = 10_000;
const MAX_CACHED = 1024;
const MAX_PASSWD = 1 << 20;
const NAME_RE = /^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$/;

/** The user a request names: Basic auth's user part, else `username` (null: the default). */
export function requestedUser(authorization: string | undefined, username?: string | null): string | null {
  let name: string | null = null;
  const m = /^Basic\s+([A-Za-z0-9+/=]+)$/i.exec(authorization ?? "");
  if (m?.[1]) {
    const decoded = Buffer.from(m[1], "base64").toString("utf8");
    const i = decoded.indexOf(":");
    name = i < 0 ? decoded : decoded.slice(0, i);
  }
  if (!name && username) name = username;
  if (!name) return null;
  if (!NAME_RE.test(name)) throw new ForkdError("invalid_argument", `invalid user ${JSON.stringify(name)}`);
  return name;
}

function parsePasswd(text: string): Map<string, Account> {
  const out = new Map<string, Account>();
  for (const line of text.split("\n")) {
    const f = line.split(":");
    if (f.length < 7 || !f[0]) continue;
    const uid = Number(f[2]);
    const gid = Number(f[3]);
    if (!Number.isInteger(uid) || !Number.isInteger(gid)) continue;
    out.set(f[0], { name: f[0], uid, gid, home: f[5] || "/" });
  }
  return out;
}

/** The accounts of each sandbox, read from its /etc/passwd and kept for TTL_MS. */
export class Accounts {
  private readonly cache = new Map<string, { at: number; accounts: Promise<Map<string, Account>> }>();

  private accounts(sandboxId: string, agent: AgentClient): Promise<Map<string, Account>> {
    const hit = this.cache.get(sandboxId);
    if (hit && Date.now() - hit.at < TTL_MS) return hit.accounts;
    const accounts = agent
      .readFile("/etc/passwd", { maxBytes: MAX_PASSWD, timeoutMs: 10_000 })
      .then((b) => parsePasswd(b.toString("utf8")));
    if (this.cache.size >= MAX_CACHED) this.cache.clear();
    this.cache.set(sandboxId, { at: Date.now(), accounts });
    accounts.catch(() => this.cache.delete(sandboxId));
    return accounts;
  }

  /** The account for `name` (null: the default user, or root in an image without one). */
  async resolve(sandboxId: string, agent: AgentClient, name: string | null): Promise<Account> {
    const all = await this.accounts(sandboxId, agent);
    if (name === null) return all.get(DEFAULT_USER) ?? all.get("root") ?? ROOT;
    const a = all.get(name) ?? (name === "root" ? ROOT : undefined);
    if (!a)
      throw new ForkdError(
        "unauthenticated",
        `invalid user: the sandbox has no user ${JSON.stringify(name)}`,
      );
    return a;
  }
}

/**
 * Whom a file request for `account` names to the guest agent: nobody for root (the agent acts
 * as root itself), the account's name where the agent acts as users (FEATURES file-user), null
 * for an older agent, which would act as root: the caller then goes through helper commands
 * run as the user (exec honours users on every agent envd serves).
 */
export async function agentUser(agent: AgentClient, account: Account): Promise<string | undefined | null> {
  if (account.uid === 0) return undefined;
  return (await agent.fileUsers()) ? account.name : null;
}

/** `path` made absolute for `account`: relative to its home, `~` and `~/x` too; normalized. */
export function resolvePath(path: string, account: Account): string {
  if (path.includes("\0")) throw new ForkdError("invalid_argument", "path contains a NUL byte");
  if (path.length > 4096) throw new ForkdError("invalid_argument", "path is longer than 4096 bytes");
  let p = path;
  if (p === "~") p = account.home;
  else if (p.startsWith("~/")) p = posix.join(account.home, p.slice(2));
  else if (!p.startsWith("/")) p = posix.join(account.home, p);
  return posix.normalize(p);
}
