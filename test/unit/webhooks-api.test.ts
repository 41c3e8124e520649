/**
 * /v1/webhooks through the REST API, without VMs: a tenant creates, lists, shows and deletes its
 * own, never sees another's (404, as one that does not exist); an admin's is operator-wide and
 * sees every one; the secret is in the creation's reply only (never listed, shown, logged or
 * audited); E2B's event names are accepted, unknown ones refused; replies match the OpenAPI document.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { createApp } from "../../src/api/app.js";
import { WebhookService } from "../../src/webhooks/service.js";
import { DEFAULT_WEBHOOK_SETTINGS } from "../../src/webhooks/settings.js";
import { contractValidator } from "../helpers/contract.js";
import { quiet, testServices } from "../helpers/services.js";
import type { TestServices } from "../helpers/services.js";

const ADMIN = "w".repeat(20) + "0123456789abcdef";
let t: TestServices;
let app: ReturnType<typeof createApp>;
const tok: Record<string, string> = {};

before(async () => {
  t = await testServices();
  const webhooks = new WebhookService({
    dir: join(t.dir, "webhooks"),
    events: t.services.events,
    sandboxes: () => [],
    isReady: async () => false,
    log: quiet,
    settings: DEFAULT_WEBHOOK_SETTINGS,
    node: null,
    // Names resolve to a public address (no DNS in a unit test).
    guard: {
      allowed: [],
      ownAddresses: () => new Set(),
      resolve: async () => [{ address: "93.184.216.34", family: 4 }],
    },
  });
  await webhooks.start();
  t.services.webhooks = webhooks;
  app = createApp(t.services, t.tcp(ADMIN));
  for (const tenant of ["alice", "bob"])
    tok[tenant] = (await t.services.tokens.create({ tenant, scope: "tenant" })).token;
  tok.admin = ADMIN;
});

after(async () => {
  await t.services.webhooks?.close();
  await t.cleanup();
});

async function call(who: string, method: string, path: string, json?: unknown) {
  const headers: Record<string, string> = { authorization: `Bearer ${tok[who] ?? ""}` };
  if (json !== undefined) headers["content-type"] = "application/json";
  const res = await app.request(path, {
    method,
    headers,
    body: json === undefined ? undefined : JSON.stringify(json),
  });
  const body = (await res.json()) as Record<string, unknown> & { error?: { code: string } };
  (await contractValidator()).check(method, path, res.status, body);
  return { status: res.status, body };
}

test("a tenant manages its own webhooks; another tenant sees none of them; an admin sees all", async () => {
  const made = await call("alice", "POST", "/v1/webhooks", {
    url: "https://hooks.example.com/forkd",
    name: "ci",
    events: ["sandbox.lifecycle.created", "killed"],
  });
  assert.equal(made.status, 201);
  const id = made.body.id as string;
  const secret = made.body.secret as string;
  assert.match(secret, /^whsec_/);
  assert.deepEqual([made.body.tenant, made.body.events], ["alice", ["created", "killed"]]);
  const ops = await call("admin", "POST", "/v1/webhooks", {
    url: "https://ops.example.com/",
    secret: "s".repeat(24),
  });
  assert.equal(ops.status, 201);
  assert.equal(ops.body.tenant, null);
  assert.equal(ops.body.secret, "s".repeat(24));

  const mine = await call("alice", "GET", "/v1/webhooks");
  assert.deepEqual(
    (mine.body.webhooks as { id: string }[]).map((w) => w.id),
    [id],
  );
  assert.equal(JSON.stringify(mine.body).includes(secret), false, "never listed");
  assert.equal(((await call("bob", "GET", "/v1/webhooks")).body.webhooks as unknown[]).length, 0);
  assert.equal(((await call("admin", "GET", "/v1/webhooks")).body.webhooks as unknown[]).length, 2);
  const shown = await call("alice", "GET", `/v1/webhooks/${id}`);
  assert.equal(shown.status, 200);
  assert.equal(JSON.stringify(shown.body).includes(secret), false, "never shown");
  assert.equal((await call("bob", "GET", `/v1/webhooks/${id}`)).status, 404);
  assert.equal((await call("bob", "DELETE", `/v1/webhooks/${id}`)).status, 404);
  assert.equal((await call("alice", "GET", `/v1/webhooks/${ops.body.id as string}`)).status, 404);

  // Audited by id; the secret appears in no audit line.
  const lines = t.audited.filter((r) => r.action.includes("/v1/webhooks"));
  assert.ok(lines.some((r) => r.action === "POST /v1/webhooks" && r.target.webhook_id === id));
  assert.equal(JSON.stringify(t.audited).includes(secret), false);

  const gone = await call("alice", "DELETE", `/v1/webhooks/${id}`);
  assert.equal(gone.status, 200);
  assert.equal((await call("alice", "GET", `/v1/webhooks/${id}`)).status, 404);
  assert.ok(
    t.audited.some((r) => r.action === "DELETE /v1/webhooks/{webhook_id}" && r.target.webhook_id === id),
  );
});

test("bad webhooks are 400s, a tenant's private address a 403", async () => {
  const bad = async (body: unknown) => (await call("alice", "POST", "/v1/webhooks", body)).status;
  assert.equal(await bad({ url: "not a url" }), 400);
  assert.equal(await bad({ url: "file:///etc/passwd" }), 400);
  assert.equal(await bad({ url: "https://x.example.com/", events: ["sandbox.lifecycle.nope"] }), 400);
  assert.equal(await bad({ url: "https://x.example.com/", secret: "short" }), 400);
  assert.equal(await bad({ url: "https://x.example.com/", extra: 1 }), 400);
  assert.equal(await bad({ url: "http://127.0.0.1:8080/" }), 403);
  assert.equal(await bad({ url: "http://[::1]/" }), 403);
  assert.equal((await call("alice", "GET", "/v1/webhooks/wh-nope")).status, 400);
});
