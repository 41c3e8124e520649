/**
 * The seams under AgentClient (src/agent/connection.ts, streams.ts, resync-budget.ts): the
 * stream table's ids, cap and failure fan-out; the resync budget's sliding window; a connection
 * matching replies to requests, dropping late ones, and closing once with its reason.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer, connect } from "node:net";
import type { Socket } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FrameDecoder, Msg, Tag, encodeFrame, intField } from "../../src/agent/codec.js";
import type { Frame } from "../../src/agent/codec.js";
import { AgentConnection } from "../../src/agent/connection.js";
import { StreamFlow } from "../../src/agent/flow.js";
import { ResyncBudget } from "../../src/agent/resync-budget.js";
import { StreamTable } from "../../src/agent/streams.js";
import { ForkdError } from "../../src/util/errors.js";

const isCode = (code: string) => (e: unknown) => e instanceof ForkdError && e.code === code;

test("stream table: ids from 1, distinct while in flight, capped, forgotten on end", () => {
  const t = new StreamTable(3);
  const a = t.open(() => undefined);
  const b = t.open(() => undefined);
  const c = t.open(() => undefined);
  assert.deepEqual([a, b, c], [1, 2, 3]);
  assert.throws(() => t.open(() => undefined), isCode("resource_exhausted"));
  t.end(b);
  assert.equal(t.has(b), false);
  assert.equal(t.handler(b), undefined);
  const d = t.open(() => undefined);
  assert.ok(d !== a && d !== c && d !== 0);
  assert.deepEqual(t.ids(), [a, c, d]);
  t.end(12345); // unknown: nothing happens
  assert.equal(t.size, 3);
});

test("stream table: failAll empties the table first, reaches every handler past one that throws", () => {
  const t = new StreamTable();
  const seen: string[] = [];
  const err = new ForkdError("unavailable", "gone");
  t.open(() => {
    assert.equal(t.size, 0, "handlers run once the table is empty");
    seen.push("a");
    throw new Error("its own problem");
  });
  t.open((f) => {
    assert.equal(f, err);
    seen.push("b");
  });
  t.failAll(err);
  assert.deepEqual(seen, ["a", "b"]);
  assert.equal(t.size, 0);
});

test("stream table: holdsOver looks at the flows of the streams in flight only", () => {
  const t = new StreamTable();
  const flow = new StreamFlow(
    () => undefined,
    () => undefined,
  );
  const id = t.open(() => undefined, flow);
  assert.equal(t.holdsOver(10), false);
  flow.deliver(11, new Promise(() => undefined)); // held until it settles: never
  assert.equal(t.holdsOver(10), true);
  assert.equal(t.holdsOver(11), false, "more than the cap, not as much");
  t.end(id);
  assert.equal(t.holdsOver(10), false);
});

test("resync budget: max within the window, then refused without taking, then free again", () => {
  let now = 1_000_000;
  const b = new ResyncBudget(3, 60_000, () => now);
  assert.equal(b.take(), true);
  now += 10_000;
  assert.equal(b.take(), true);
  assert.equal(b.take(), true);
  assert.equal(b.used, 3);
  assert.equal(b.take(), false);
  assert.equal(b.used, 3, "a refusal takes nothing");
  now += 50_001; // the first one is now older than the window
  assert.equal(b.take(), true);
  assert.equal(b.used, 3);
  now += 10_000_000;
  assert.equal(b.take(), true);
  assert.equal(b.used, 1);
});

/** A connection to a scripted guest that answers each host frame with `reply` (or nothing). */
async function withGuest(
  reply: (f: Frame, sock: Socket) => void,
  fn: (conn: AgentConnection, guest: () => Socket) => Promise<void>,
): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-conn-"));
  const path = join(dir, "agent.sock");
  const held: { guest: Socket | null } = { guest: null };
  const server = createServer((sock) => {
    held.guest = sock;
    const dec = new FrameDecoder();
    sock.on("data", (d: Buffer) => {
      for (const f of dec.push(d)) reply(f, sock);
    });
    sock.on("error", () => undefined);
  });
  await new Promise<void>((r) => server.listen(path, r));
  const sock = connect(path);
  await new Promise<void>((r, j) => sock.once("connect", r).once("error", j));
  const conn = new AgentConnection(sock, null);
  try {
    await fn(conn, () => held.guest!);
  } finally {
    conn.close();
    held.guest?.destroy();
    server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

test("connection: replies go to their request, late and unknown ones are dropped, close once", async () => {
  await withGuest(
    (f, sock) => {
      if (f.type !== Msg.PING) return; // STAT: never answered
      sock.write(encodeFrame(Msg.DATA, 999, [[Tag.DATA, "nobody's"]]));
      sock.write(encodeFrame(Msg.OK, f.stream, [[Tag.VERSION, 7]]));
    },
    async (conn, guest) => {
      const [a, b] = await Promise.all([
        conn.request(Msg.PING, [], 2_000),
        conn.request(Msg.PING, [], 2_000),
      ]);
      assert.equal(intField(a, Tag.VERSION), 7);
      assert.equal(intField(b, Tag.VERSION), 7);
      await assert.rejects(conn.request(Msg.STAT, [[Tag.PATH, "/"]], 100), isCode("timeout"));
      // The guest answers the timed-out request late: dropped, the connection goes on.
      guest().write(encodeFrame(Msg.OK, 3, []));
      assert.equal(intField(await conn.request(Msg.PING, [], 2_000), Tag.VERSION), 7);
      const closes: unknown[] = [];
      conn.on("close", (e) => closes.push(e));
      const inFlight = conn.request(Msg.STAT, [[Tag.PATH, "/"]], 5_000);
      conn.close();
      conn.close();
      await assert.rejects(inFlight, isCode("unavailable"));
      assert.equal(closes.length, 1);
      assert.equal(conn.closed, true);
      assert.throws(() => conn.open(() => undefined), isCode("unavailable"));
      assert.equal(conn.isOpen(1), false);
    },
  );
});

test("connection: garbage without a way to redial gives up for good and says why", async () => {
  await withGuest(
    (_f, sock) => sock.write(Buffer.alloc(64, 0xff)),
    async (conn) => {
      const broken = new Promise<string>((r) => conn.once("broken", r));
      await assert.rejects(conn.request(Msg.PING, [], 2_000), isCode("agent_protocol"));
      assert.match(await broken, /corrupted its agent channel/);
      assert.equal(conn.closed, true);
    },
  );
});
