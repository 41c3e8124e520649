/**
 * The web console's sessions on a cluster's gateways (docs/cluster.md, "Gateway"): any replica
 * must open a session another made, and a gateway keeps nothing, so a session is sealed, not
 * stored. Its cookie (HttpOnly) is an AES-256-GCM box, under a key derived from the cluster
 * secret (HKDF-SHA256), of the bearer token it was opened with, the SHA-256 of its page key and
 * its expiry (SESSION_TTL_MS after the login: absolute, not idle: nothing records a use). The
 * page key is given once in the login's reply, as on one daemon (./console-sessions.ts): the
 * cookie alone opens nothing. A gateway opens the box, checks the key and forwards the token, so
 * nodes authenticate the console's calls like any other, and revoking the token ends the session
 * on every gateway. Tickets (for EventSource, WebSocket and download URLs) are sealed too, under
 * another derived key: bound to the session's cookie, 60 s; their single use is recorded in
 * etcd by the caller (`use`: src/cluster/tickets.ts). A box opened with the wrong key, forged,
 * cut or expired is refused the same way. Logging out drops the cookie and the page's key; a
 * copy of both stays valid until its expiry.
 */
import {
  createCipheriv,
  createDecipheriv,
  createHash,
  hkdfSync,
  randomBytes,
  timingSafeEqual,
} from "node:crypto";
import { TICKET_TTL_MS, randomId } from "./console-sessions.js";
import type { SessionClock, SessionSecrets } from "./console-sessions.js";

export const SEALED_SESSION_TTL_MS = 12 * 3_600_000;
/** The cluster secret's least length (FORKD_CLUSTER_SECRET_FILE). */
export const MIN_CLUSTER_SECRET = 32;
/** The longest box accepted (a bearer token is at most 512 characters). */
const MAX_BOX = 2048;

const sha = (s: string): Buffer => createHash("sha256").update(s, "utf8").digest();

function derive(secret: Buffer, purpose: string): Buffer {
  return Buffer.from(hkdfSync("sha256", secret, "forkd-cluster", purpose, 32));
}

function seal(key: Buffer, value: unknown): string {
  const iv = randomBytes(12);
  const c = createCipheriv("aes-256-gcm", key, iv);
  const body = Buffer.concat([c.update(JSON.stringify(value), "utf8"), c.final()]);
  return Buffer.concat([iv, body, c.getAuthTag()]).toString("base64url");
}

function unseal(key: Buffer, box: unknown): Record<string, unknown> | null {
  if (typeof box !== "string" || box.length === 0 || box.length > MAX_BOX) return null;
  const raw = Buffer.from(box, "base64url");
  if (raw.length < 12 + 16 + 2) return null;
  try {
    const d = createDecipheriv("aes-256-gcm", key, raw.subarray(0, 12));
    d.setAuthTag(raw.subarray(raw.length - 16));
    const text = Buffer.concat([d.update(raw.subarray(12, raw.length - 16)), d.final()]).toString("utf8");
    const v: unknown = JSON.parse(text);
    return typeof v === "object" && v !== null ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

const hexEq = (a: unknown, b: Buffer): boolean =>
  typeof a === "string" && a.length === 64 && timingSafeEqual(Buffer.from(a, "hex"), b);

export class SealedSessions {
  private readonly sessionKey: Buffer;
  private readonly ticketKey: Buffer;

  constructor(
    secret: Buffer,
    private readonly clock: SessionClock = { now: () => Date.now() },
    private readonly ttlMs = SEALED_SESSION_TTL_MS,
  ) {
    if (secret.length < MIN_CLUSTER_SECRET)
      throw new Error(`the cluster secret must be at least ${MIN_CLUSTER_SECRET} bytes`);
    this.sessionKey = derive(secret, "console-session/1");
    this.ticketKey = derive(secret, "console-ticket/1");
  }

  /** A new session for bearer `token`: its cookie (`id`) and the page's `key`. */
  open(token: string): SessionSecrets {
    const key = randomId();
    const id = seal(this.sessionKey, {
      b: token,
      k: sha(key).toString("hex"),
      exp: this.clock.now() + this.ttlMs,
    });
    return { id, key };
  }

  /** The token of the session of cookie `id` opened by `key` (null: none, or expired). */
  get(id: unknown, key: unknown): { token: string } | null {
    if (typeof key !== "string" || key.length === 0 || key.length > 256) return null;
    const s = this.session(id);
    return s && hexEq(s.k, sha(key)) ? { token: s.token } : null;
  }

  private session(id: unknown): { token: string; k: unknown } | null {
    const v = unseal(this.sessionKey, id);
    if (!v || typeof v.b !== "string" || typeof v.exp !== "number" || v.exp <= this.clock.now()) return null;
    return { token: v.b, k: v.k };
  }

  /** A ticket (60 s) standing for the key of the session of cookie `id`; null: no such session. */
  ticket(id: unknown, key: unknown): string | null {
    if (this.get(id, key) === null) return null;
    return seal(this.ticketKey, {
      s: sha(id as string).toString("hex"),
      exp: this.clock.now() + TICKET_TTL_MS,
      n: randomBytes(8).toString("hex"),
    });
  }

  /**
   * The token of the session of cookie `id` that `ticket` was given for, once: `use` records the
   * ticket's use (false: it was used before); null for a wrong, expired or used ticket.
   */
  async redeemTicket(
    id: unknown,
    ticket: unknown,
    use: (ticket: string, expiresAt: number) => Promise<boolean>,
  ): Promise<{ token: string } | null> {
    if (typeof id !== "string") return null;
    const t = unseal(this.ticketKey, ticket);
    if (!t || typeof t.exp !== "number" || t.exp <= this.clock.now() || !hexEq(t.s, sha(id))) return null;
    const s = this.session(id);
    if (!s) return null;
    if (!(await use(ticket as string, t.exp))) return null;
    return { token: s.token };
  }
}
