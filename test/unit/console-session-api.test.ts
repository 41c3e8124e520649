/**
 * The console's session on the daemon's TCP listener (src/api/routes/console-session.ts and the
 * edge's cookie credential): a token is exchanged for the cookie (a wrong one is refused and
 * counted like a failed bearer token); the cookie is a credential for GETs, for other methods
 * only with X-Forkd-Console: 1; a revoked token ends its sessions; logout ends one; the
 * console's assets need no credentials; on the unix socket the caller is the local admin.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Hono } from "hono";
import { createApp } from "../../src/api/app.js";
import type { ApiEnv } from "../../src/api/env.js";
import { ConsoleSessions } from "../../src/console/sessions.js";
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

async function login(token: string): Promise<Response> {
  return app.request("/v1/console/session", {
    method: "POST",
    headers: { "content-type": "application/json", "x-forkd-console": "1" },
    body: JSON.stringify({ token }),
  });
}

const cookieOf = (res: Response): string => (res.headers.get("set-cookie") ?? "").split(";")[0] ?? "";

test("the assets need no credentials; the session needs one", async () => {
  const page = await app.request("/console/");
  assert.equal(page.status, 200);
  assert.match(page.headers.get("content-security-policy") ?? "", /default-src 'self'/);
  assert.equal((await app.request("/v1/console/session")).status, 401);
  assert.equal((await app.request("/v1/sandboxes")).status, 401);
});

test("a token becomes the cookie; the cookie is the caller for GETs, and with the header for others", async () => {
  const res = await login(alice.token);
  assert.equal(res.status, 200);
  assert.match(
    res.headers.get("set-cookie") ?? "",
    /^forkd_console=[\w-]{43}; HttpOnly; SameSite=Strict; Path=\//,
  );
  const body = (await res.json()) as { caller: { tenant: string; token: string; admin: boolean } };
  assert.deepEqual([body.caller.tenant, body.caller.token, body.caller.admin], ["alice", alice.id, false]);
  const cookie = cookieOf(res);

  const who = await app.request("/v1/console/session", { headers: { cookie } });
  assert.equal(who.status, 200);
  assert.equal(((await who.json()) as { caller: { tenant: string } }).caller.tenant, "alice");
  assert.equal((await app.request("/v1/sandboxes", { headers: { cookie } })).status, 200);

  // A POST with only the cookie (what a cross-site form could send) is refused.
  const forged = await app.request("/v1/sandboxes", {
    method: "POST",
    headers: { cookie, "content-type": "application/json" },
    body: JSON.stringify({ snapshot_tag: "nope" }),
  });
  assert.equal(forged.status, 403);
  const withHeader = await app.request("/v1/sandboxes", {
    method: "POST",
    headers: { cookie, "content-type": "application/json", "x-forkd-console": "1" },
    body: JSON.stringify({ snapshot_tag: "nope" }),
  });
  assert.equal(withHeader.status, 404, "past the edge: the snapshot does not exist");

  // Logout ends the session.
  const out = await app.request("/v1/console/session", {
    method: "DELETE",
    headers: { cookie, "x-forkd-console": "1" },
  });
  assert.equal(out.status, 200);
  assert.match(out.headers.get("set-cookie") ?? "", /Max-Age=0/);
  assert.equal((await app.request("/v1/console/session", { headers: { cookie } })).status, 401);
});

test("a revoked token ends its sessions", async () => {
  const r = await t.services.tokens.create({ tenant: "carol", scope: "tenant" });
  const cookie = cookieOf(await login(r.token));
  assert.equal((await app.request("/v1/sandboxes", { headers: { cookie } })).status, 200);
  await t.services.tokens.revoke(r.entry.id);
  assert.equal((await app.request("/v1/sandboxes", { headers: { cookie } })).status, 401);
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
