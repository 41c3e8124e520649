/**
 * A guest is hostile: whatever arrives on the agent channel, the host's client fails cleanly
 * (typed error, pending requests rejected; the connection made again, or closed for good when
 * the guest persists, see agent-resync.test.ts) and never hangs or crashes.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import type { Socket } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AgentClient } from "../../src/agent/client.js";
import { Msg, Tag, encodeFrame } from "../../src/agent/codec.js";
import { ForkdError } from "../../src/util/errors.js";

/** A fake guest that answers the first request with `reply(streamId)`. */
async function withGuest(
  reply: (stream: number, sock: Socket) => void,
  fn: (a: AgentClient) => Promise<void>,
) {
  const dir = await mkdtemp(join(tmpdir(), "forkd-hostile-"));
  const path = join(dir, "agent.sock");
  const server = createServer((sock) => {
    sock.once("data", (d: Buffer) => reply(d.readUInt32BE(5), sock));
    sock.on("error", () => undefined);
  });
  await new Promise<void>((r) => server.listen(path, r));
  const agent = await AgentClient.connect(path, 2_000);
  try {
    await fn(agent);
  } finally {
    agent.close();
    server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const isCode = (code: string) => (e: unknown) => e instanceof ForkdError && e.code === code;

test("garbage bytes from the guest fail the request with agent_protocol; a guest that goes on is given up", async () => {
  await withGuest(
    (_, sock) => sock.write(Buffer.from("\xff\xff\xff\xffHELLO I AM NOT A FRAME", "latin1")),
    async (agent) => {
      const broken = new Promise((r) => agent.once("broken", r));
      await assert.rejects(agent.ping(2_000), isCode("agent_protocol"));
      // Every new connection answers with garbage too: after a few tries, closed for good.
      await broken;
      assert.equal(agent.closed, true);
      await assert.rejects(agent.ping(2_000), isCode("agent_protocol"));
    },
  );
});

test("a field that overruns its frame is a protocol error", async () => {
  await withGuest(
    (stream, sock) => {
      const f = Buffer.alloc(9 + 5);
      f.writeUInt32BE(5 + 5, 0);
      f.writeUInt8(Msg.OK, 4);
      f.writeUInt32BE(stream, 5);
      f.writeUInt8(Tag.VERSION, 9);
      f.writeUInt32BE(1000, 10); // claims 1000 bytes, has none
      sock.write(f);
    },
    async (agent) => assert.rejects(agent.ping(2_000), isCode("agent_protocol")),
  );
});

test("a wrong reply type for an exec is a protocol error, not a hang", async () => {
  await withGuest(
    (stream, sock) => sock.write(encodeFrame(Msg.DATA, stream, [[Tag.DATA, "?"]])),
    async (agent) => assert.rejects(agent.exec({ argv: ["true"] }).result, isCode("agent_protocol")),
  );
});

test("a guest that never answers hits the request deadline", async () => {
  await withGuest(
    () => undefined,
    async (agent) => assert.rejects(agent.ping(300), isCode("timeout")),
  );
});

test("a guest that hangs up fails pending requests with unavailable", async () => {
  await withGuest(
    (_, sock) => sock.destroy(),
    async (agent) => assert.rejects(agent.ping(2_000), isCode("unavailable")),
  );
});

test("malformed eval JSON from the guest is rejected", async () => {
  await withGuest(
    (stream, sock) => sock.write(encodeFrame(Msg.OK, stream, [[Tag.JSON, '{"ok": "yes", "value": 5}']])),
    async (agent) => assert.rejects(agent.eval("1"), isCode("agent_protocol")),
  );
});
