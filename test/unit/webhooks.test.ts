/**
 * Lifecycle webhooks without VMs (src/webhooks): the signature and its check, the backoff's
 * bounds, a queue's persistence and bound, the lifecycle read off bus events, and delivery to
 * receivers this test serves: each event once, signed, retried while the receiver fails, kept
 * across a restart, a hanging receiver cut at the deadline without holding another webhook,
 * tenants told only of their own sandboxes, a tenant's webhook refused a private address.
 */
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { EventBus } from "../../src/events/bus.js";
import type { ReadonlySandbox } from "../../src/sandbox/index.js";
import { DEFAULT_RETRY, retryDelayMs, retryHorizonMs } from "../../src/webhooks/backoff.js";
import { LifecycleTracker } from "../../src/webhooks/lifecycle.js";
import type { LifecycleEvent } from "../../src/webhooks/lifecycle.js";
import { WebhookQueue } from "../../src/webhooks/queue.js";
import { WebhookService } from "../../src/webhooks/service.js";
import { DEFAULT_WEBHOOK_SETTINGS } from "../../src/webhooks/settings.js";
import type { WebhookSettings } from "../../src/webhooks/settings.js";
import { e2bSignature, signPayload, verifySignature } from "../../src/webhooks/signature.js";
import { createHash } from "node:crypto";
import { verifyWebhook } from "@forkd/sdk";

const quiet = { info: () => undefined, warn: () => undefined };
const dirs: string[] = [];
const servers: Server[] = [];
after(async () => {
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

async function tmp(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), "forkd-webhooks-"));
  dirs.push(d);
  return d;
}

function sandbox(id: string, state: string, owner: string | null = null, exitReason: string | null = null) {
  return {
    record: { id, tag: owner ? `${owner}/app` : "python", owner, metadata: { k: "v" } },
    state,
    exitReason,
  } as unknown as ReadonlySandbox;
}
const ID = (n: number) => `sb-${"a".repeat(15)}${"abcdefgh"[n]}`;

interface Got {
  headers: IncomingMessage["headers"];
  body: string;
}

/** A receiver: `answer` decides each reply (a status, or "hang": never answer). */
async function receiver(answer: (n: number) => number | "hang" = () => 200) {
  const got: Got[] = [];
  let n = 0;
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const a = answer(n++);
      if (a === "hang") return;
      if (a >= 200 && a < 300) got.push({ headers: req.headers, body: Buffer.concat(chunks).toString() });
      res.writeHead(a).end();
    });
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { got, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook` };
}

async function until(what: string, ok: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`timed out waiting: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const FAST: WebhookSettings = {
  ...DEFAULT_WEBHOOK_SETTINGS,
  timeoutMs: 300,
  retry: { baseMs: 20, maxMs: 200, maxAttempts: 5 },
};

async function service(
  dir: string,
  bus: EventBus,
  settings: WebhookSettings = FAST,
  list: ReadonlySandbox[] = [],
) {
  const s = new WebhookService({
    dir,
    events: bus,
    sandboxes: () => list,
    isReady: async () => true,
    log: quiet,
    settings,
    node: null,
    // The operator allows the test's receivers by name: the guard's refusals are tested below.
    guard: {
      allowed: [{ hostname: "127.0.0.1", port: null }],
      ownAddresses: () => new Set(),
      resolve: async () => [],
    },
  });
  await s.start();
  return s;
}

test("the signature is HMAC-SHA256 of timestamp.body; the check refuses a changed body, another secret, an old timestamp", () => {
  const body = '{"a":1}';
  const sig = signPayload("s".repeat(20), 1_700_000_000, body);
  assert.match(sig, /^v1=[0-9a-f]{64}$/);
  const ok = (secret: string, b: string, ts: string, nowS = 1_700_000_010) =>
    verifySignature(secret, sig, ts, b, { nowS });
  assert.equal(ok("s".repeat(20), body, "1700000000"), true);
  assert.equal(ok("s".repeat(20), '{"a":2}', "1700000000"), false, "changed body");
  assert.equal(ok("t".repeat(20), body, "1700000000"), false, "another secret");
  assert.equal(ok("s".repeat(20), body, "1700000001"), false, "another timestamp");
  assert.equal(ok("s".repeat(20), body, "1700000000", 1_700_001_000), false, "too old");
  assert.equal(ok("s".repeat(20), body, "abc"), false, "not a timestamp");
  // E2B's: unpadded base64 of sha256(secret + body).
  const want = createHash("sha256")
    .update("s".repeat(20) + body)
    .digest("base64")
    .replace(/=+$/, "");
  assert.equal(e2bSignature("s".repeat(20), body), want);
});

test("the SDK's verifyWebhook accepts the daemon's signature (the Python SDK's test holds the same vector)", () => {
  const body = '{"a":1}';
  const headers = {
    "forkd-signature": signPayload("s".repeat(20), 1_700_000_000, body),
    "forkd-timestamp": "1700000000",
  };
  assert.equal(
    headers["forkd-signature"],
    "v1=76b63ef3661c69438a4bb1a7461b4cf04800ea2500e7a88f0b073a7e46dbee98",
  );
  assert.equal(verifyWebhook("s".repeat(20), headers, Buffer.from(body), { nowS: 1_700_000_010 }), true);
  assert.equal(verifyWebhook("s".repeat(20), headers, '{"a":2}', { nowS: 1_700_000_010 }), false);
  assert.equal(verifyWebhook("s".repeat(20), headers, body, { nowS: 1_700_000_400 }), false);
  assert.equal(verifyWebhook("s".repeat(20), {}, body), false);
});

test("backoff doubles from its base, is capped, jitters within the upper half, and gives up in about an hour", () => {
  const p = { baseMs: 1000, maxMs: 8000, maxAttempts: 10 };
  assert.equal(
    retryDelayMs(1, p, () => 0),
    500,
  );
  assert.equal(
    retryDelayMs(1, p, () => 0.999999),
    1000,
  );
  assert.equal(
    retryDelayMs(3, p, () => 0.999999),
    4000,
  );
  assert.equal(
    retryDelayMs(9, p, () => 0.999999),
    8000,
    "capped",
  );
  for (let n = 1; n < 30; n++) {
    const d = retryDelayMs(n, p, Math.random);
    const exp = Math.min(8000, 1000 * 2 ** (n - 1));
    assert.ok(d >= exp / 2 && d <= exp, `attempt ${n}: ${d}`);
  }
  const h = retryHorizonMs(DEFAULT_RETRY);
  assert.ok(h > 45 * 60_000 && h < 90 * 60_000, `horizon ${h} ms`);
});

test("a queue is written atomically (0600), read back after a restart, and drops its oldest past its bound", async () => {
  const dir = await tmp();
  const path = join(dir, "q.json");
  const errors: unknown[] = [];
  const q = await WebhookQueue.open(path, 3, (e) => errors.push(e));
  const ev = (i: number) => ({ id: `e${i}`, type: "t", body: `{"i":${i}}`, queued: i, attempts: 0, next: i });
  let dropped = 0;
  for (let i = 0; i < 5; i++) dropped += q.push(ev(i));
  assert.equal(dropped, 2);
  assert.deepEqual(
    q.list().map((x) => x.id),
    ["e2", "e3", "e4"],
  );
  q.remove("e3");
  await q.flush();
  assert.equal((await stat(path)).mode & 0o777, 0o600);
  const again = await WebhookQueue.open(path, 3, (e) => errors.push(e));
  assert.deepEqual(
    again.list().map((x) => x.id),
    ["e2", "e4"],
  );
  // A lowered bound keeps the newest.
  const smaller = await WebhookQueue.open(path, 1, (e) => errors.push(e));
  assert.deepEqual(
    smaller.list().map((x) => x.id),
    ["e4"],
  );
  assert.equal(errors.length, 0);
  // A damaged file is reported and read as empty, never a crash.
  await writeFile(path, "{not json");
  const damaged = await WebhookQueue.open(path, 3, (e) => errors.push(e));
  assert.equal(damaged.size, 0);
  assert.equal(errors.length, 1);
  await damaged.destroy();
  await assert.rejects(readFile(path), /ENOENT/);
});

test("the lifecycle: created, paused, resumed, exited with its reason, killed, branched; re-adopted ones are not created", async () => {
  const seen: LifecycleEvent[] = [];
  const t = new LifecycleTracker(
    async (tag) => tag !== "failed",
    (e) => seen.push(e),
  );
  t.seed([sandbox(ID(7), "running")]);
  const on = (e: Parameters<LifecycleTracker["onEvent"]>[0]) => t.onEvent(e);
  on({ type: "sandbox", sandbox: sandbox(ID(7), "running") }); // a re-adopted one changes nothing
  on({ type: "sandbox", sandbox: sandbox(ID(0), "running", "alice") });
  on({ type: "sandbox", sandbox: sandbox(ID(0), "running", "alice") }); // no change
  on({ type: "sandbox", sandbox: sandbox(ID(0), "paused", "alice") });
  on({ type: "sandbox", sandbox: sandbox(ID(0), "running", "alice") });
  const writing = { tag: "alice/b1", status: "writing" as const, started: "", source: ID(0), error: null };
  on({ type: "snapshot", tag: "alice/b1", writing });
  on({ type: "snapshot", tag: "alice/b1" });
  on({ type: "snapshot", tag: "failed", writing: { ...writing, tag: "failed" } });
  on({ type: "snapshot", tag: "failed" });
  on({ type: "snapshot", tag: "other", writing: { ...writing, tag: "other", source: null } });
  on({ type: "snapshot", tag: "other" });
  on({ type: "sandbox", sandbox: sandbox(ID(0), "exited", "alice", "idle timeout") });
  on({ type: "sandbox-gone", id: ID(0), exitReason: "idle timeout", owner: "alice" }); // told at its exit
  on({ type: "sandbox", sandbox: sandbox(ID(1), "running") });
  on({ type: "sandbox-gone", id: ID(1), exitReason: "killed", owner: null });
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(
    seen.map((e) => [e.type, e.sandboxId, e.exitReason ?? e.snapshot ?? null]),
    [
      ["created", ID(0), null],
      ["paused", ID(0), null],
      ["resumed", ID(0), null],
      ["exited", ID(0), "idle timeout"],
      ["created", ID(1), null],
      ["killed", ID(1), "killed"],
      // Told when the branch is ready (after a read): after what happened meanwhile.
      ["branched", ID(0), "alice/b1"],
    ],
  );
  assert.equal(seen[0]?.owner, "alice");
  assert.deepEqual(seen[0]?.metadata, { k: "v" });
});

test("each event reaches its webhook once, signed, in E2B's shape; a tenant's webhook hears only its own sandboxes", async () => {
  const dir = await tmp();
  const bus = new EventBus();
  const ops = await receiver();
  const alice = await receiver();
  const s = await service(dir, bus);
  const opsHook = await s.create(null, { url: ops.url });
  const aliceHook = await s.create("alice", {
    url: alice.url,
    events: ["created", "killed"],
    secret: "a".repeat(32),
  });
  assert.match(opsHook.secret, /^whsec_/);
  assert.equal(aliceHook.secret, "a".repeat(32));
  assert.equal(JSON.stringify(s.list(null)).includes(opsHook.secret), false, "never listed");
  bus.emit({ type: "sandbox", sandbox: sandbox(ID(0), "running", "alice") });
  bus.emit({ type: "sandbox", sandbox: sandbox(ID(1), "running", "bob") });
  bus.emit({ type: "sandbox", sandbox: sandbox(ID(0), "paused", "alice") });
  bus.emit({ type: "sandbox-gone", id: ID(0), exitReason: "killed", owner: "alice" });
  await until("deliveries", () => ops.got.length === 4 && alice.got.length === 2);
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(ops.got.length, 4, "once each");
  assert.equal(alice.got.length, 2);
  const bodies = alice.got.map((g) => JSON.parse(g.body) as Record<string, unknown>);
  assert.deepEqual(
    bodies.map((b) => [b.type, b.sandboxId, b.sandboxTemplateId]),
    [
      ["sandbox.lifecycle.created", ID(0), "app"],
      ["sandbox.lifecycle.killed", ID(0), "app"],
    ],
  );
  assert.deepEqual(
    ops.got.map((g) => (JSON.parse(g.body) as { sandboxTemplateId: string }).sandboxTemplateId),
    ["alice/app", "bob/app", "alice/app", "alice/app"],
    "an operator's webhook names keys whole",
  );
  for (const g of alice.got) {
    const sig = String(g.headers["forkd-signature"]);
    assert.ok(verifySignature("a".repeat(32), sig, String(g.headers["forkd-timestamp"]), g.body));
    assert.equal(g.headers["e2b-signature"], e2bSignature("a".repeat(32), g.body));
    assert.equal(g.headers["forkd-event-id"], (JSON.parse(g.body) as { id: string }).id);
  }
  const ids = new Set(ops.got.map((g) => g.headers["forkd-event-id"]));
  assert.equal(ids.size, 4, "distinct event ids");
  assert.equal(s.get("alice", aliceHook.info.id).state.delivered, 2);
  assert.throws(() => s.get("bob", aliceHook.info.id), /no webhook/);
  await s.close();
});

test("a failing receiver gets the event again with backoff, once it answers; past the last attempt it is dropped and counted", async () => {
  const dir = await tmp();
  const bus = new EventBus();
  const flaky = await receiver((n) => (n < 3 ? 503 : 200));
  const dead = await receiver(() => 500);
  const s = await service(dir, bus);
  await s.create(null, { url: flaky.url });
  const d = await s.create(null, { url: dead.url });
  bus.emit({ type: "sandbox", sandbox: sandbox(ID(0), "running") });
  await until("retried delivery", () => flaky.got.length === 1);
  assert.equal(flaky.got[0]?.headers["forkd-delivery-attempt"], "4");
  await until("dropped", () => s.stats.droppedAttempts === 1);
  assert.equal(s.get(null, d.info.id).state.failedAttempts, FAST.retry.maxAttempts);
  assert.equal(s.get(null, d.info.id).state.queued, 0);
  assert.match(s.get(null, d.info.id).state.lastError ?? "", /500/);
  await s.close();
});

test("undelivered events survive a restart and are sent by the next daemon", async () => {
  const dir = await tmp();
  const bus = new EventBus();
  let up = false;
  const r = await receiver(() => (up ? 200 : 503));
  const slow: WebhookSettings = { ...FAST, retry: { baseMs: 60_000, maxMs: 60_000, maxAttempts: 5 } };
  const s1 = await service(dir, bus, slow);
  const hook = await s1.create(null, { url: r.url });
  bus.emit({ type: "sandbox", sandbox: sandbox(ID(0), "running") });
  bus.emit({ type: "sandbox", sandbox: sandbox(ID(0), "paused") });
  await until("first attempts", () => s1.stats.failedAttempts >= 1);
  await s1.close();
  assert.equal(s1.get(null, hook.info.id).state.queued, 2);
  up = true;
  // The next daemon: its queue read back; the events' retry time is an hour away, but a
  // delivery that succeeds makes the rest due (the receiver is back).
  const s2 = await service(dir, new EventBus(), { ...slow, retry: { ...slow.retry, baseMs: 10 } });
  const again = s2.get(null, hook.info.id);
  assert.equal(again.state.queued, 2);
  // Not due for a minute: a new event's success brings them forward.
  s2["onLifecycle"]({
    type: "created",
    sandboxId: ID(1),
    owner: null,
    tag: "python",
    metadata: {},
    at: Date.now(),
  });
  await until("backlog", () => r.got.length === 3);
  assert.deepEqual(
    r.got.map((g) => (JSON.parse(g.body) as { type: string; sandboxId: string }).sandboxId).sort(),
    [ID(0), ID(0), ID(1)],
  );
  await s2.close();
});

test("a receiver that never answers is cut at the deadline and holds no other webhook", async () => {
  const dir = await tmp();
  const bus = new EventBus();
  const hang = await receiver(() => "hang");
  const fine = await receiver();
  const s = await service(dir, bus, { ...FAST, concurrency: 2, timeoutMs: 500 });
  const h = await s.create(null, { url: hang.url });
  await s.create(null, { url: fine.url });
  for (let i = 0; i < 5; i++) bus.emit({ type: "sandbox", sandbox: sandbox(ID(i), "running") });
  await until("the fine one's deliveries", () => fine.got.length === 5);
  await until("the hanging one cut", () => s.get(null, h.info.id).state.failedAttempts >= 1, 5_000);
  assert.match(s.get(null, h.info.id).state.lastError ?? "", /no answer within 500 ms/);
  // Stopping ends the attempt under way (not counted as the receiver's failure); the event stays queued.
  const failed = s.get(null, h.info.id).state.failedAttempts;
  await s.close();
  assert.equal(s.get(null, h.info.id).state.failedAttempts, failed);
  assert.ok(s.get(null, h.info.id).state.queued >= 1);
});

test("a tenant's webhook may not post to a private or loopback address; an operator's may; bad URLs are refused", async () => {
  const dir = await tmp();
  const s = new WebhookService({
    dir,
    events: new EventBus(),
    sandboxes: () => [],
    isReady: async () => true,
    log: quiet,
    settings: { ...FAST, maxPerTenant: 1 },
    node: null,
  });
  await s.start();
  await assert.rejects(s.create("alice", { url: "http://127.0.0.1:9/x" }), /public address/);
  await assert.rejects(s.create("alice", { url: "http://169.254.169.254/latest" }), /public address/);
  await assert.rejects(s.create("alice", { url: "http://10.1.2.3/" }), /public address/);
  await assert.rejects(s.create(null, { url: "ftp://example.com/" }), /only http and https/);
  await assert.rejects(s.create(null, { url: "http://u:p@example.com/" }), /no credentials/);
  const op = await s.create(null, { url: "http://127.0.0.1:9/x" });
  // Creations at once are each written (one after the other, never one over another).
  await Promise.all([1, 2, 3].map((i) => s.create(null, { url: `http://127.0.0.1:9/${i}` })));
  assert.equal(op.info.tenant, null);
  await s.create("alice", { url: "http://8.8.8.8/hook" });
  await assert.rejects(s.create("alice", { url: "http://8.8.4.4/hook" }), /FORKD_WEBHOOK_MAX_PER_TENANT/);
  // Definitions survive a restart, secrets included (0600), and a delete removes one.
  assert.equal((await stat(join(dir, "webhooks.json"))).mode & 0o777, 0o600);
  await s.close();
  const again = new WebhookService({
    dir,
    events: new EventBus(),
    sandboxes: () => [],
    isReady: async () => true,
    log: quiet,
    settings: FAST,
    node: null,
  });
  await again.start();
  assert.equal(again.list(null).length, 5);
  assert.equal(again.list("alice").length, 1);
  await assert.rejects(again.delete("bob", op.info.id), /no webhook/);
  await again.delete(null, op.info.id);
  assert.equal(again.list(null).length, 4);
  await again.close();
});
