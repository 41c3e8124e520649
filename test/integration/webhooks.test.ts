/**
 * Lifecycle webhooks against a real daemon and real VMs (issue 26): a receiver this test serves
 * gets a sandbox's created, branched and killed events once each, signed with its secret; a
 * receiver that is down (nothing listens on its port) gets the same events once it listens again
 * (retries with backoff); a receiver that accepts and never answers does not slow forks (median
 * fork latency with it registered against without; no absolute time gate). Kept short: one
 * snapshot, seven one-child forks. The mechanics without VMs: test/unit/webhooks*.test.ts.
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { IncomingMessage, Server } from "node:http";
import type { Socket } from "node:net";
import type { AddressInfo } from "node:net";
import { checkedRequest } from "../helpers/contract.js";
import { steps } from "../helpers/steps.js";
import { makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { verifySignature } from "../../src/webhooks/signature.js";

let d: TestDaemon;
const { step, failed } = steps();
const servers: Server[] = [];
const sockets = new Set<Socket>();

interface Got {
  headers: IncomingMessage["headers"];
  body: string;
  event: { id: string; type: string; sandboxId: string; eventData: Record<string, unknown> };
}

/** A receiver on `port` (0: any) answering 200 and keeping what it got; "hang": never answers. */
async function listen(
  port: number,
  mode: "ok" | "hang",
  got: Got[] = [],
): Promise<{ port: number; got: Got[] }> {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (mode === "hang") return;
      const body = Buffer.concat(chunks).toString();
      got.push({ headers: req.headers, body, event: JSON.parse(body) as Got["event"] });
      res.writeHead(204).end();
    });
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(port, "127.0.0.1", r));
  return { port: (server.address() as AddressInfo).port, got };
}

const api = <T>(method: string, path: string, body?: unknown, timeoutMs?: number) =>
  checkedRequest<T>(d.ep, method, path, body, timeoutMs);

async function until(what: string, ok: () => boolean, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** One child forked and killed; how long the fork's request took (ms). */
async function forkKill(): Promise<number> {
  const t0 = performance.now();
  const r = await api<{ sandboxes: { id: string }[] }>(
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: "wh", n: 1 },
    300_000,
  );
  const ms = performance.now() - t0;
  for (const s of r.sandboxes) await api("DELETE", `/v1/sandboxes/${s.id}`);
  return ms;
}

let good: { port: number; got: Got[] };
const downGot: Got[] = [];
let downPort = 0;
const secrets: Record<string, string> = {};
let sb = "";
let branchTag = "";

before(async () => {
  good = await listen(0, "ok");
  // A port nothing listens on (yet): taken, then freed.
  const probe = await listen(0, "ok");
  downPort = probe.port;
  await new Promise((r) => servers.pop()!.close(r));
  // Retries start at 200 ms (doubling): a receiver back after a few seconds is reached soon.
  d = await makeDaemon({ FORKD_POOL_SIZE: "0", FORKD_WEBHOOK_RETRY_BASE_MS: "200" });
});

after(async () => {
  await d.destroy(failed());
  for (const s of sockets) s.destroy();
  for (const s of servers) await new Promise((r) => s.close(r));
});

step("webhooks are registered (the secret shown once), a snapshot made", async () => {
  for (const [name, port] of [
    ["good", good.port],
    ["down", downPort],
  ] as const) {
    const w = await api<{ id: string; secret: string }>("POST", "/v1/webhooks", {
      url: `http://127.0.0.1:${port}/hook`,
      name,
      events: ["created", "branched", "killed"],
    });
    secrets[name] = w.secret;
  }
  const list = await api<{ webhooks: { name: string }[] }>("GET", "/v1/webhooks");
  assert.deepEqual(list.webhooks.map((w) => w.name).sort(), ["down", "good"]);
  assert.equal(JSON.stringify(list).includes(secrets.good!), false);
  await api("POST", "/v1/snapshots", { tag: "wh", memory_mib: 256 }, 600_000);
});

step("a sandbox's created, branched and killed reach the receiver once each, signed", async () => {
  const r = await api<{ sandboxes: { id: string }[] }>(
    "POST",
    "/v1/sandboxes",
    { snapshot_tag: "wh", n: 1 },
    300_000,
  );
  sb = r.sandboxes[0]!.id;
  branchTag = (
    await api<{ tag: string }>("POST", `/v1/sandboxes/${sb}/branch`, { tag: "wh-branch" }, 300_000)
  ).tag;
  await api("DELETE", `/v1/sandboxes/${sb}`);
  const mine = () => good.got.filter((g) => g.event.sandboxId === sb);
  await until("three events", () => mine().length >= 3, 60_000);
  // Anything sent twice would have come by now (deliveries are 10 ms apart on loopback).
  await new Promise((r) => setTimeout(r, 1_000));
  assert.deepEqual(
    mine()
      .map((g) => g.event.type)
      .sort(),
    ["sandbox.lifecycle.branched", "sandbox.lifecycle.created", "sandbox.lifecycle.killed"],
  );
  assert.equal(
    mine().find((g) => g.event.type === "sandbox.lifecycle.branched")?.event.eventData.snapshot,
    branchTag,
  );
  assert.equal(new Set(mine().map((g) => g.event.id)).size, 3);
  for (const g of mine()) {
    assert.ok(
      verifySignature(
        secrets.good!,
        String(g.headers["forkd-signature"]),
        String(g.headers["forkd-timestamp"]),
        g.body,
      ),
      `${g.event.type}: valid signature`,
    );
    assert.equal(
      verifySignature(
        secrets.down!,
        String(g.headers["forkd-signature"]),
        String(g.headers["forkd-timestamp"]),
        g.body,
      ),
      false,
    );
  }
});

step("a receiver that was down gets the same events once it listens again", async () => {
  const state = await api<{
    webhooks: { name: string; state: { queued: number; failed_attempts: number } }[];
  }>("GET", "/v1/webhooks");
  const down = state.webhooks.find((w) => w.name === "down")!;
  assert.ok(down.state.queued >= 3, `queued: ${down.state.queued}`);
  assert.ok(down.state.failed_attempts >= 3);
  await listen(downPort, "ok", downGot);
  const mine = () => downGot.filter((g) => g.event.sandboxId === sb);
  await until("the backlog", () => mine().length >= 3, 120_000);
  await new Promise((r) => setTimeout(r, 1_000));
  assert.deepEqual(
    mine()
      .map((g) => g.event.type)
      .sort(),
    ["sandbox.lifecycle.branched", "sandbox.lifecycle.created", "sandbox.lifecycle.killed"],
  );
  // The same events (ids) the other receiver got, each retried at least once, and signed.
  for (const g of mine()) {
    assert.ok(Number(g.headers["forkd-delivery-attempt"]) >= 2);
    assert.ok(
      verifySignature(
        secrets.down!,
        String(g.headers["forkd-signature"]),
        String(g.headers["forkd-timestamp"]),
        g.body,
      ),
    );
  }
});

step("a receiver that hangs does not slow forks", async () => {
  await api("DELETE", `/v1/snapshots/${branchTag}`);
  const without = [await forkKill(), await forkKill(), await forkKill()];
  let accepted = 0;
  const hang = await listen(0, "hang");
  servers.at(-1)!.on("request", () => accepted++);
  await api("POST", "/v1/webhooks", { url: `http://127.0.0.1:${hang.port}/hook`, name: "hang" });
  const withHang = [await forkKill(), await forkKill(), await forkKill()];
  assert.ok(accepted >= 1, "the hanging receiver was posted to");
  // A fork held by the hanging receiver would wait out its 10 s deadline: several TCG forks long.
  assert.ok(
    median(withHang) < 2.5 * median(without),
    `fork ms without ${without.map(Math.round).join(",")}; with a hanging receiver ${withHang.map(Math.round).join(",")}`,
  );
  const hooks = await api<{ webhooks: { id: string; name: string }[] }>("GET", "/v1/webhooks");
  for (const w of hooks.webhooks) await api("DELETE", `/v1/webhooks/${w.id}`);
});
