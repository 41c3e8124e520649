/**
 * The console's session on the daemon's TCP listener (src/api/routes/console-session.ts and the
 * edge's session credential): a token is exchanged for the cookie and the page's key (a wrong
 * one is refused and counted like a failed bearer token); the cookie with its key is a
 * credential for GETs, for other methods only with X-Forkd-Console: 1; a cookie without its key
 * (stolen from another port of the host) is none, even with X-Forkd-Console: 1; a ticket stands
 * for the key once, on a GET; a revoked token ends its sessions; logout ends one; the console's
 * assets need no credentials; on the unix socket the caller is the local admin.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Hono } from "hono";
import { createApp } from "../../src/api/app.js";
import type { ApiEnv } from "../../src/api/env.js";
import { ConsoleSessions } from "../../src/access/console-sessions.js";
import { testServices } from "../helpers/services.js";
import type { TestServices } from "../helpers/services.js";

let t: TestServices;
let app: Hono<ApiEnv>;
let alice: { token: string; id: string };

before(async () => {
  t = await testServices({ authFailures: { rps: 0.001, burst: 3 } });
  const dist = join(t.dir, "dist");
  await mkdir(dist);
  await writeFile(join(dist, "index.html"), "<!doctype html><title>console</title>");
  t.services.console = { dist, sessions: new ConsoleSessions() };
  app = createApp(t.services, t.tcp());
  const r = await t.services.tokens.create({ tenant: "alice", scope: "tenant" });
  alice = { token: r.token, id: r.entry.id };
});

after(async () => {
  await t.cleanup();
});

async function login(token: string, on: Hono<ApiEnv> = app): Promise<Response> {
  return on.request("/v1/console/session", {
    method: "POST",
    headers: { "content-type": "application/json", "x-forkd-console": "1" },
    body: JSON.stringify({ token }),
  });
}

const cookieOf = (res: Response): string => (res.headers.get("set-cookie") ?? "").split(";")[0] ?? "";

/** A login's credentials as the page sends them: the cookie and the key from the reply's body. */
async function session(res: Response): Promise<{ cookie: string; "x-forkd-console-key": string }> {
  const body = (await res.json()) as { key: string };
  assert.match(body.key, /^[\w-]{43}$/);
  return { cookie: cookieOf(res), "x-forkd-console-key": body.key };
}

test("the assets need no credentials; the session needs one", async () => {
  const page = await app.request("/console/");
  assert.equal(page.status, 200);
  assert.match(page.headers.get("content-security-policy") ?? "", /default-src 'self'/);
  assert.equal((await app.request("/v1/console/session")).status, 401);
  assert.equal((await app.request("/v1/sandboxes")).status, 401);
});

test("a token becomes the cookie and the key; with both: the caller for GETs, and with the header for others", async () => {
  const res = await login(alice.token);
  assert.equal(res.status, 200);
  assert.match(
    res.headers.get("set-cookie") ?? "",
    /^forkd_console=[\w-]{43}; HttpOnly; SameSite=Strict; Path=\//,
  );
  const body = (await res.clone().json()) as { caller: { tenant: string; token: string; admin: boolean } };
  assert.deepEqual([body.caller.tenant, body.caller.token, body.caller.admin], ["alice", alice.id, false]);
  const h = await session(res);

  const who = await app.request("/v1/console/session", { headers: h });
  assert.equal(who.status, 200);
  assert.equal(((await who.json()) as { caller: { tenant: string } }).caller.tenant, "alice");
  assert.equal((await app.request("/v1/sandboxes", { headers: h })).status, 200);

  // A POST without X-Forkd-Console (what a cross-site form could send) is refused.
  const forged = await app.request("/v1/sandboxes", {
    method: "POST",
    headers: { ...h, "content-type": "application/json" },
    body: JSON.stringify({ snapshot_tag: "nope" }),
  });
  assert.equal(forged.status, 403);
  const withHeader = await app.request("/v1/sandboxes", {
    method: "POST",
    headers: { ...h, "content-type": "application/json", "x-forkd-console": "1" },
    body: JSON.stringify({ snapshot_tag: "nope" }),
  });
  assert.equal(withHeader.status, 404, "past the edge: the snapshot does not exist");

  // Logout with the cookie alone ends nothing; with the key it ends the session.
  await app.request("/v1/console/session", {
    method: "DELETE",
    headers: { cookie: h.cookie, "x-forkd-console": "1" },
  });
  assert.equal((await app.request("/v1/console/session", { headers: h })).status, 200);
  const out = await app.request("/v1/console/session", {
    method: "DELETE",
    headers: { ...h, "x-forkd-console": "1" },
  });
  assert.equal(out.status, 200);
  assert.match(out.headers.get("set-cookie") ?? "", /Max-Age=0/);
  assert.equal((await app.request("/v1/console/session", { headers: h })).status, 401);
});

/** A listener of its own, whose address may fail often (each replay below is a failed attempt). */
async function roomyApp(): Promise<{ t: TestServices; app: Hono<ApiEnv> }> {
  const t2 = await testServices({ authFailures: { rps: 100, burst: 1000 } });
  t2.services.console = { dist: join(t.dir, "dist"), sessions: new ConsoleSessions() };
  return { t: t2, app: createApp(t2.services, t2.tcp()) };
}

test("a stolen cookie replayed with X-Forkd-Console: 1 but without the page's key is no credential: no token minted", async (ctx) => {
  const { t, app } = await roomyApp();
  ctx.after(() => t.cleanup());
  const admin = await t.services.tokens.create({ tenant: "ops", scope: "admin" });
  const h = await session(await login(admin.token, app));
  const before = t.services.tokens.size;
  const mint = (headers: Record<string, string>) =>
    app.request("/v1/tokens", {
      method: "POST",
      headers: { ...headers, "content-type": "application/json", "x-forkd-console": "1" },
      body: JSON.stringify({ tenant: "mallory", scope: "admin" }),
    });
  for (const stolen of [
    { cookie: h.cookie } as Record<string, string>,
    { cookie: h.cookie, "x-forkd-console-key": "1" },
    { cookie: h.cookie, "x-forkd-console-key": "" },
  ]) {
    const r = await mint(stolen);
    assert.equal(r.status, 401, JSON.stringify(stolen));
    assert.equal(r.headers.get("set-cookie"), null);
  }
  assert.equal(t.services.tokens.size, before, "no token was minted");
  // Reads too: the cookie alone names no caller.
  assert.equal((await app.request("/v1/sandboxes", { headers: { cookie: h.cookie } })).status, 401);
  assert.equal((await app.request("/v1/tokens", { headers: { cookie: h.cookie } })).status, 401);
  // The page, which holds the key, still works.
  const ok = await mint(h);
  assert.equal(ok.status, 201);
  assert.equal(t.services.tokens.size, before + 1);
});

test("a ticket stands for the key once, on a GET (a download, the events, a terminal), with its cookie", async (ctx) => {
  const { t, app } = await roomyApp();
  ctx.after(() => t.cleanup());
  const r = await t.services.tokens.create({ tenant: "alice", scope: "tenant" });
  const h = await session(await login(r.token, app));
  const ticket = async () => {
    const r = await app.request("/v1/console/ticket", {
      method: "POST",
      headers: { ...h, "x-forkd-console": "1" },
    });
    assert.equal(r.status, 200);
    return ((await r.json()) as { ticket: string }).ticket;
  };
  // No ticket for a cookie alone.
  const none = await app.request("/v1/console/ticket", {
    method: "POST",
    headers: { cookie: h.cookie, "x-forkd-console": "1" },
  });
  assert.equal(none.status, 401);
  const t1 = await ticket();
  assert.equal(
    (await app.request(`/v1/sandboxes?console_ticket=${t1}`, { headers: { cookie: h.cookie } })).status,
    200,
  );
  assert.equal(
    (await app.request(`/v1/sandboxes?console_ticket=${t1}`, { headers: { cookie: h.cookie } })).status,
    401,
    "used once",
  );
  const t2 = await ticket();
  assert.equal(
    (await app.request(`/v1/sandboxes?console_ticket=${t2}`)).status,
    401,
    "not without its cookie",
  );
  const t3 = await ticket();
  const post = await app.request(`/v1/sandboxes?console_ticket=${t3}`, {
    method: "POST",
    headers: { cookie: h.cookie, "content-type": "application/json", "x-forkd-console": "1" },
    body: JSON.stringify({ snapshot_tag: "nope" }),
  });
  assert.equal(post.status, 401, "a ticket is for GETs only");
});

test("behind a proxy that terminates TLS (X-Forwarded-Proto: https) the cookie is Secure; on plain HTTP not", async () => {
  const r = await t.services.tokens.create({ tenant: "dave", scope: "tenant" });
  const viaTls = await app.request("/v1/console/session", {
    method: "POST",
    headers: { "content-type": "application/json", "x-forkd-console": "1", "x-forwarded-proto": "https" },
    body: JSON.stringify({ token: r.token }),
  });
  assert.equal(viaTls.status, 200);
  assert.match(viaTls.headers.get("set-cookie") ?? "", /; Secure$/);
  const plain = await login(r.token);
  assert.doesNotMatch(plain.headers.get("set-cookie") ?? "", /Secure/);
});

test("a wrong token sets nothing and counts as a failed authentication", async () => {
  let last: Response | null = null;
  for (let i = 0; i < 5; i++) {
    last = await login("forkd_" + "x".repeat(40));
    assert.equal(last.headers.get("set-cookie"), null);
    if (last.status === 429) break;
    assert.equal(last.status, 401);
  }
  assert.equal(last?.status, 429, "the address is limited after its failures");
});

test("on the unix socket the console's caller is the local admin", async () => {
  const local = createApp(t.services);
  const r = await local.request("/v1/console/session");
  assert.equal(r.status, 200);
  assert.equal(((await r.json()) as { caller: { kind: string } }).caller.kind, "local");
});

test("a login without X-Forkd-Console (a cross-site form's text/plain post) is refused and sets no cookie", async () => {
  const res = await app.request("/v1/console/session", {
    method: "POST",
    headers: { "content-type": "text/plain" },
    body: `{"token":"x=","token":"${alice.token}"}`,
  });
  assert.equal(res.status, 403);
  assert.equal(res.headers.get("set-cookie"), null);
});
