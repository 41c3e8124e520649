/**
 * The web console's sessions, in memory only: one-time login secrets (single use, unused ones
 * expire after 10 min) and the sessions they open (random 256-bit ids, idle expiry 12 h). A
 * session may stand for a token (the daemon's TCP listener re-checks that token on each
 * request, so revoking it ends its sessions). Secrets and ids are looked up by their SHA-256,
 * and a presented secret is compared with timingSafeEqual on digests of equal length, so neither
 * the lookup nor the compare tells anything of a stored value (its prefix or its length).
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";

export const SECRET_TTL_MS = 10 * 60_000;
export const SESSION_IDLE_MS = 12 * 3_600_000;
/** Bounds on what a flood of logins could make this hold. */
const MAX_SESSIONS = 10_000;
/** Sessions of one subject: its own oldest goes first, so one token's logins evict nobody else's. */
export const MAX_SESSIONS_PER_SUBJECT = 64;
const MAX_SECRETS = 100;

export interface ConsoleSession {
  /** Who this session stands for (the TCP listener: its token); null: the loopback console's admin. */
  readonly subject: string | null;
  lastUsed: number;
}

export interface SessionClock {
  now(): number;
}

const digest = (s: string): Buffer => createHash("sha256").update(s, "utf8").digest();
const key = (s: string): string => digest(s).toString("hex");

/** A random 256-bit value, URL-safe. */
export const randomId = (): string => randomBytes(32).toString("base64url");

export class ConsoleSessions {
  private readonly secrets = new Map<string, { digest: Buffer; expires: number }>();
  private readonly sessions = new Map<string, ConsoleSession>();

  constructor(
    private readonly clock: SessionClock = { now: () => Date.now() },
    private readonly idleMs = SESSION_IDLE_MS,
    private readonly secretTtlMs = SECRET_TTL_MS,
  ) {}

  /** A new one-time login secret. */
  newSecret(): string {
    this.sweep();
    if (this.secrets.size >= MAX_SECRETS) {
      const oldest = this.secrets.keys().next().value;
      if (oldest !== undefined) this.secrets.delete(oldest);
    }
    const secret = randomId();
    this.secrets.set(key(secret), { digest: digest(secret), expires: this.clock.now() + this.secretTtlMs });
    return secret;
  }

  /**
   * Uses `secret` (once): the new session's id, or null for a wrong, expired or used secret.
   */
  redeem(secret: unknown): string | null {
    if (typeof secret !== "string" || secret.length === 0 || secret.length > 256) return null;
    const k = key(secret);
    const entry = this.secrets.get(k);
    if (!entry) return null;
    // The map found it by digest; the compare is of digests, equal in length whatever was sent.
    if (!timingSafeEqual(entry.digest, digest(secret))) return null;
    this.secrets.delete(k);
    if (entry.expires <= this.clock.now()) return null;
    return this.open(null);
  }

  /** Opens a session (for `subject`, null: the local admin) and returns its id. */
  open(subject: string | null): string {
    this.sweep();
    // Its own oldest (least recently used) first; the whole map's only past its global bound.
    let own = 0;
    let ownOldest: { k: string; at: number } | null = null;
    for (const [k, v] of this.sessions) {
      if (v.subject !== subject) continue;
      own++;
      if (ownOldest === null || v.lastUsed < ownOldest.at) ownOldest = { k, at: v.lastUsed };
    }
    if (own >= MAX_SESSIONS_PER_SUBJECT && ownOldest) this.sessions.delete(ownOldest.k);
    else if (this.sessions.size >= MAX_SESSIONS) {
      const oldest = this.sessions.keys().next().value;
      if (oldest !== undefined) this.sessions.delete(oldest);
    }
    const id = randomId();
    this.sessions.set(key(id), { subject, lastUsed: this.clock.now() });
    return id;
  }

  /** The live session named by `id` (its idle time restarts), or null. */
  get(id: string | undefined): ConsoleSession | null {
    if (id === undefined || id.length === 0 || id.length > 256) return null;
    const k = key(id);
    const s = this.sessions.get(k);
    if (!s) return null;
    const now = this.clock.now();
    if (now - s.lastUsed >= this.idleMs) {
      this.sessions.delete(k);
      return null;
    }
    s.lastUsed = now;
    return s;
  }

  /** Ends the session named by `id` (logout); nothing if there is none. */
  close(id: string | undefined): void {
    if (id !== undefined) this.sessions.delete(key(id));
  }

  get size(): number {
    return this.sessions.size;
  }

  private sweep(): void {
    const now = this.clock.now();
    for (const [k, v] of this.secrets) if (v.expires <= now) this.secrets.delete(k);
    for (const [k, v] of this.sessions) if (now - v.lastUsed >= this.idleMs) this.sessions.delete(k);
  }
}

/** The session cookie's name, and reading it from a Cookie header. */
export const COOKIE = "forkd_console";

/**
 * The loopback console's cookie name: cookies are not kept apart by port, so two `forkd console`
 * servers on one host (or one restarted on another port) would overwrite each other's session.
 */
export const loopbackCookie = (port: number): string => `${COOKIE}_${port}`;

export function cookieOf(header: string | undefined, name = COOKIE): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(";")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    if (part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/** The Set-Cookie value that holds session `id` (empty and expired: the logout). */
export function setCookie(id: string | null, secure = false, name = COOKIE): string {
  const base = `${name}=${id ?? ""}; HttpOnly; SameSite=Strict; Path=/`;
  return (id === null ? `${base}; Max-Age=0` : base) + (secure ? "; Secure" : "");
}
