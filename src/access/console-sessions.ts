/**
 * The web console's sessions, in memory only: one-time login secrets (single use, unused ones
 * expire after 10 min) and the sessions they open (random 256-bit ids, idle expiry 12 h). A
 * session is two secrets: its id, the HttpOnly cookie, and its key, given once in the login's
 * reply body to the page, which keeps it in sessionStorage and sends it as `X-Forkd-Console-Key`
 * with every call. Browsers send a host's cookies to every port of it (a tenant's exposed guest
 * port on the console's host gets the cookie); another origin never reads the page's storage, so
 * a cookie without its key opens nothing. Where a browser cannot send a header (EventSource, a
 * WebSocket, a download link) the page asks for a ticket (single use, 60 s, bound to the session)
 * and puts it in the URL instead of the key. A session may stand for a token (the daemon's TCP
 * listener re-checks that token on each request, so revoking it ends its sessions). Secrets, ids,
 * keys and tickets are looked up by their SHA-256 and compared with timingSafeEqual on digests of
 * equal length, so neither the lookup nor the compare tells anything of a stored value.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";

export const SECRET_TTL_MS = 10 * 60_000;
export const TICKET_TTL_MS = 60_000;
export const SESSION_IDLE_MS = 12 * 3_600_000;
/** Bounds on what a flood of logins could make this hold. */
const MAX_SESSIONS = 10_000;
/** Sessions of one subject: its own oldest goes first, so one token's logins evict nobody else's. */
export const MAX_SESSIONS_PER_SUBJECT = 64;
const MAX_SECRETS = 100;
const MAX_TICKETS = 1_000;

/** The header that carries a session's key, and the query parameter that carries a ticket. */
export const KEY_HEADER = "x-forkd-console-key";
export const TICKET_PARAM = "console_ticket";

export interface ConsoleSession {
  /** Who this session stands for (the TCP listener: its token); null: the loopback console's admin. */
  readonly subject: string | null;
  lastUsed: number;
}

/** A session's two secrets: the cookie's id and the page's key. */
export interface SessionSecrets {
  id: string;
  key: string;
}

interface Stored {
  session: ConsoleSession;
  /** SHA-256 of the key. */
  key: Buffer;
}

export interface SessionClock {
  now(): number;
}

const digest = (s: string): Buffer => createHash("sha256").update(s, "utf8").digest();
const key = (s: string): string => digest(s).toString("hex");
const usable = (v: unknown): v is string => typeof v === "string" && v.length > 0 && v.length <= 256;

/** A random 256-bit value, URL-safe. */
export const randomId = (): string => randomBytes(32).toString("base64url");

export class ConsoleSessions {
  private readonly secrets = new Map<string, { digest: Buffer; expires: number }>();
  private readonly sessions = new Map<string, Stored>();
  /** Tickets by digest: the digest of the session id they stand for, and their expiry. */
  private readonly tickets = new Map<string, { session: string; expires: number }>();

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

  /** Whether `secret` is a login secret not used yet and not expired (it stays unused). */
  pending(secret: unknown): boolean {
    if (!usable(secret)) return false;
    const entry = this.secrets.get(key(secret));
    return (
      entry !== undefined && timingSafeEqual(entry.digest, digest(secret)) && entry.expires > this.clock.now()
    );
  }

  /**
   * Uses `secret` (once): the new session's secrets, or null for a wrong, expired or used secret.
   */
  redeem(secret: unknown): SessionSecrets | null {
    if (!usable(secret)) return null;
    const k = key(secret);
    const entry = this.secrets.get(k);
    if (!entry) return null;
    // The map found it by digest; the compare is of digests, equal in length whatever was sent.
    if (!timingSafeEqual(entry.digest, digest(secret))) return null;
    this.secrets.delete(k);
    if (entry.expires <= this.clock.now()) return null;
    return this.open(null);
  }

  /** Opens a session (for `subject`, null: the local admin) and returns its id and key. */
  open(subject: string | null): SessionSecrets {
    this.sweep();
    // Its own oldest (least recently used) first; the whole map's only past its global bound.
    let own = 0;
    let ownOldest: { k: string; at: number } | null = null;
    for (const [k, v] of this.sessions) {
      if (v.session.subject !== subject) continue;
      own++;
      if (ownOldest === null || v.session.lastUsed < ownOldest.at) ownOldest = { k, at: v.session.lastUsed };
    }
    if (own >= MAX_SESSIONS_PER_SUBJECT && ownOldest) this.sessions.delete(ownOldest.k);
    else if (this.sessions.size >= MAX_SESSIONS) {
      const oldest = this.sessions.keys().next().value;
      if (oldest !== undefined) this.sessions.delete(oldest);
    }
    const id = randomId();
    const k = randomId();
    this.sessions.set(key(id), { session: { subject, lastUsed: this.clock.now() }, key: digest(k) });
    return { id, key: k };
  }

  /**
   * The live session whose cookie is `id` and whose key is `k` (its idle time restarts), or null:
   * the cookie alone names nothing.
   */
  get(id: unknown, k: unknown): ConsoleSession | null {
    if (!usable(k)) return null;
    const stored = this.lookup(id);
    if (!stored || !timingSafeEqual(stored.key, digest(k))) return null;
    stored.session.lastUsed = this.clock.now();
    return stored.session;
  }

  /** A ticket (single use, TICKET_TTL_MS) standing for the key of session `id`; null: no such session. */
  ticket(id: unknown, k: unknown): string | null {
    if (this.get(id, k) === null) return null;
    this.sweep();
    if (this.tickets.size >= MAX_TICKETS) {
      const oldest = this.tickets.keys().next().value;
      if (oldest !== undefined) this.tickets.delete(oldest);
    }
    const t = randomId();
    this.tickets.set(key(t), { session: key(id as string), expires: this.clock.now() + TICKET_TTL_MS });
    return t;
  }

  /** Uses ticket `t` (once) with the cookie `id` it was given for: its live session, or null. */
  redeemTicket(id: unknown, t: unknown): ConsoleSession | null {
    if (!usable(t) || !usable(id)) return null;
    const tk = key(t);
    const entry = this.tickets.get(tk);
    if (!entry) return null;
    this.tickets.delete(tk);
    if (entry.expires <= this.clock.now()) return null;
    const want = Buffer.from(entry.session, "hex");
    if (!timingSafeEqual(want, digest(id))) return null;
    const stored = this.lookup(id);
    if (!stored) return null;
    stored.session.lastUsed = this.clock.now();
    return stored.session;
  }

  /** Ends the session whose cookie is `id` (logout, a revoked token); nothing if there is none. */
  close(id: string | undefined): void {
    if (id !== undefined) this.sessions.delete(key(id));
  }

  private lookup(id: unknown): Stored | null {
    if (!usable(id)) return null;
    const k = key(id);
    const s = this.sessions.get(k);
    if (!s) return null;
    if (this.clock.now() - s.session.lastUsed >= this.idleMs) {
      this.sessions.delete(k);
      return null;
    }
    return s;
  }

  get size(): number {
    return this.sessions.size;
  }

  private sweep(): void {
    const now = this.clock.now();
    for (const [k, v] of this.secrets) if (v.expires <= now) this.secrets.delete(k);
    for (const [k, v] of this.sessions) if (now - v.session.lastUsed >= this.idleMs) this.sessions.delete(k);
    for (const [k, v] of this.tickets) if (v.expires <= now) this.tickets.delete(k);
  }
}

/** The session cookie's name, and reading it from a Cookie header. */
/** The web console's session cookie (`forkd_console`, and `forkd_console_PORT` of `forkd console`). */
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
