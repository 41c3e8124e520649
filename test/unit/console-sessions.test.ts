/**
 * The web console's sessions (src/access/console-sessions.ts): a login secret opens one session once;
 * wrong, malformed, expired and reused secrets open none; sessions end after their idle time
 * (use restarts it) or on logout; one subject's logins evict only its own least recently used
 * session; a cookie is a session only with its key (or a ticket, once, for 60 s); the cookie is
 * read and written as the browser sends it (the loopback's named by port).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  COOKIE,
  ConsoleSessions,
  MAX_SESSIONS_PER_SUBJECT,
  SECRET_TTL_MS,
  SESSION_IDLE_MS,
  TICKET_TTL_MS,
  cookieOf,
  loopbackCookie,
  setCookie,
} from "../../src/access/console-sessions.js";

function clock(): { now: () => number; advance: (ms: number) => void } {
  let t = 1_000_000;
  return { now: () => t, advance: (ms) => void (t += ms) };
}

test("a login secret opens one session, once", () => {
  const s = new ConsoleSessions();
  const secret = s.newSecret();
  assert.match(secret, /^[A-Za-z0-9_-]{43}$/, "256 random bits, URL-safe");
  const sid = s.redeem(secret);
  assert.ok(sid !== null);
  assert.notEqual(sid.id, secret);
  assert.notEqual(sid.key, sid.id);
  assert.equal(s.get(sid.id, sid.key)?.subject, null, "the loopback console's admin");
  assert.equal(s.redeem(secret), null, "a reused secret opens nothing");
  assert.equal(s.size, 1);
});

test("wrong, malformed and differently sized secrets open nothing (and never throw)", () => {
  const s = new ConsoleSessions();
  const secret = s.newSecret();
  for (const bad of [
    "",
    "x",
    secret.slice(0, -1),
    secret + "A",
    secret.toUpperCase(),
    "a".repeat(300),
    undefined,
    42,
    null,
  ])
    assert.equal(s.redeem(bad), null, `refused: ${String(bad)}`);
  assert.equal(s.size, 0);
  assert.ok(s.redeem(secret) !== null, "the real one still works after the wrong ones");
});

test("an unused secret expires; a session ends after its idle time, and use restarts it", () => {
  const c = clock();
  const s = new ConsoleSessions(c);
  const late = s.newSecret();
  c.advance(SECRET_TTL_MS);
  assert.equal(s.redeem(late), null, "expired after 10 min unused");
  const sid = s.redeem(s.newSecret());
  assert.ok(sid);
  c.advance(SESSION_IDLE_MS - 1);
  assert.ok(s.get(sid.id, sid.key), "still live just before its idle time");
  c.advance(SESSION_IDLE_MS - 1);
  assert.ok(s.get(sid.id, sid.key), "the previous use restarted the idle time");
  c.advance(SESSION_IDLE_MS);
  assert.equal(s.get(sid.id, sid.key), null, "idle for 12 h: gone");
  assert.equal(s.get(sid.id, sid.key), null);
});

test("logout ends a session; unknown and absent ids are no sessions", () => {
  const s = new ConsoleSessions();
  const sid = s.open("token:abc");
  assert.equal(s.get(sid.id, sid.key)?.subject, "token:abc");
  s.close(sid.id);
  assert.equal(s.get(sid.id, sid.key), null);
  assert.equal(s.get(undefined, sid.key), null);
  assert.equal(s.get("", sid.key), null);
  assert.equal(s.get("x".repeat(1000), sid.key), null);
  s.close(undefined);
});

test("a cookie without its key (or with another session's) is no session", () => {
  const s = new ConsoleSessions();
  const a = s.open(null);
  const b = s.open(null);
  for (const bad of [undefined, "", "1", a.id, b.key, a.key.slice(0, -1), a.key + "A", "x".repeat(300), 7])
    assert.equal(s.get(a.id, bad), null, `refused: ${String(bad)}`);
  assert.ok(s.get(a.id, a.key), "the pair still works after the wrong ones");
});

test("a ticket stands for the key once, within 60 s, only with its own cookie", () => {
  const c = clock();
  const s = new ConsoleSessions(c);
  const a = s.open("token:a");
  const b = s.open("token:b");
  assert.equal(s.ticket(a.id, undefined), null, "a cookie alone gets no ticket");
  assert.equal(s.ticket(a.id, b.key), null);
  const t = s.ticket(a.id, a.key);
  assert.ok(t !== null);
  assert.equal(s.redeemTicket(b.id, t), null, "another session's cookie cannot use it");
  const t2 = s.ticket(a.id, a.key)!;
  assert.equal(s.redeemTicket(a.id, t2)?.subject, "token:a");
  assert.equal(s.redeemTicket(a.id, t2), null, "used once");
  const late = s.ticket(a.id, a.key)!;
  c.advance(TICKET_TTL_MS);
  assert.equal(s.redeemTicket(a.id, late), null, "expired");
  for (const bad of [undefined, "", "x".repeat(300), a.key, a.id])
    assert.equal(s.redeemTicket(a.id, bad), null, `refused: ${String(bad)}`);
});

test("the cookie: read among others, written HttpOnly and SameSite=Strict, cleared on logout", () => {
  assert.equal(cookieOf(`a=1; ${COOKIE}=abc; b=2`), "abc");
  assert.equal(cookieOf(`${COOKIE}x=abc`), undefined);
  assert.equal(cookieOf(undefined), undefined);
  assert.equal(setCookie("abc"), `${COOKIE}=abc; HttpOnly; SameSite=Strict; Path=/`);
  assert.match(setCookie(null, true), /Max-Age=0; Secure$/);
});

test("one subject's many logins evict its own least recently used session, never another's", () => {
  const c = clock();
  const s = new ConsoleSessions(c);
  const other = s.open("token:bob");
  const mine: { id: string; key: string }[] = [];
  for (let i = 0; i < MAX_SESSIONS_PER_SUBJECT; i++) {
    mine.push(s.open("token:alice"));
    c.advance(1);
  }
  // The first is used again: the second is now the least recently used.
  assert.ok(s.get(mine[0]!.id, mine[0]!.key));
  s.open("token:alice");
  assert.equal(s.get(mine[1]!.id, mine[1]!.key), null, "alice's least recently used session made room");
  assert.ok(s.get(mine[0]!.id, mine[0]!.key));
  assert.ok(s.get(other.id, other.key), "bob's session is untouched");
  for (let i = 0; i < 3 * MAX_SESSIONS_PER_SUBJECT; i++) s.open("token:alice");
  assert.ok(s.get(other.id, other.key));
  assert.equal(s.size, MAX_SESSIONS_PER_SUBJECT + 1);
});

test("the loopback console's cookie is named by its port", () => {
  const name = loopbackCookie(41234);
  assert.equal(name, `${COOKIE}_41234`);
  assert.equal(cookieOf(`${COOKIE}=a; ${name}=b`, name), "b");
  assert.equal(cookieOf(`${COOKIE}=a`, name), undefined);
  assert.match(setCookie("x", false, name), /^forkd_console_41234=x; HttpOnly/);
});
