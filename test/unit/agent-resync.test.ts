/**
 * The agent client against scripted fake guests: an old agent that ignores windows is held back
 * by pausing the connection (bounded heap); garbage on the channel fails what is in flight, then
 * the client reconnects and works again, and past its bound reports the channel broken; waits
 * that used to be unbounded (STARTED, a write whose guest stops reading) end at their deadline.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import type { Server, Socket } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AgentClient } from "../../src/agent/client.js";
import { CHUNK, FrameDecoder, Msg, Tag, encodeFrame, intField } from "../../src/agent/codec.js";
import type { Frame } from "../../src/agent/codec.js";
import { WINDOW } from "../../src/agent/flow.js";
import { ForkdError } from "../../src/util/errors.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const isCode = (code: string) => (e: unknown) => e instanceof ForkdError && e.code === code;

interface Conn {
  n: number;
  sock: Socket;
  frames: Frame[];
}

/** A fake guest: `onFrame` sees each host frame with its connection (numbered from 0). */
async function fakeGuest(
  onFrame: (c: Conn, f: Frame) => void,
  fn: (agent: AgentClient, conns: Conn[]) => Promise<void>,
): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-fake-"));
  const path = join(dir, "agent.sock");
  const conns: Conn[] = [];
  const server: Server = createServer((sock) => {
    const c: Conn = { n: conns.length, sock, frames: [] };
    conns.push(c);
    const dec = new FrameDecoder();
    sock.on("data", (d: Buffer) => {
      for (const f of dec.push(d)) {
        c.frames.push(f);
        onFrame(c, f);
      }
    });
    sock.on("error", () => undefined);
  });
  await new Promise<void>((r) => server.listen(path, r));
  const agent = await AgentClient.connect(path, 2_000);
  try {
    await fn(agent, conns);
  } finally {
    agent.close();
    for (const c of conns) c.sock.destroy();
    server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const pong = (c: Conn, f: Frame): void => {
  c.sock.write(encodeFrame(Msg.OK, f.stream, [[Tag.VERSION, 1]]));
};
const GARBAGE = Buffer.from("\xff\xfe\xfd\xfc and then some noise, 64 bytes of it............", "latin1");

test("an old agent that ignores windows is held back by pausing the connection", async () => {
  let wrote = 0;
  let blocked = false;
  await fakeGuest(
    (c, f) => {
      if (f.type === Msg.PING) return pong(c, f);
      if (f.type !== Msg.EXEC) return;
      // An old agent: STARTED without WINDOW, then output as fast as the socket takes it.
      c.sock.write(encodeFrame(Msg.STARTED, f.stream, [[Tag.PID, 7]]));
      const chunk = encodeFrame(Msg.STDOUT, f.stream, [[Tag.DATA, Buffer.alloc(CHUNK)]]);
      const pump = () => {
        while (wrote < 256 << 20) {
          wrote += CHUNK;
          if (!c.sock.write(chunk)) {
            blocked = true;
            c.sock.once("drain", pump);
            return;
          }
        }
        c.sock.write(encodeFrame(Msg.EXIT, f.stream, [[Tag.EXIT_CODE, 0]]));
      };
      pump();
    },
    async (agent) => {
      let got = 0;
      let gate!: () => void;
      const open = new Promise<void>((r) => (gate = r));
      const ex = agent.exec({ argv: ["flood"] }, { onStdout: (d) => ((got += d.length), open) });
      await ex.started;
      let last = -1;
      while (got !== last) {
        last = got;
        await sleep(300);
      }
      assert.ok(blocked, "the guest's writes were pushed back");
      assert.ok(got <= 5 * WINDOW, `held ${got} bytes: bounded near the cap (${4 * WINDOW})`);
      assert.ok(wrote < 256 << 20, "the guest could not send everything");
      gate();
      assert.equal((await ex.result).exitCode, 0);
      assert.equal(got, 256 << 20);
    },
  );
});

test("garbage on the channel fails what is in flight; the client reconnects and works again", async () => {
  await fakeGuest(
    (c, f) => {
      if (f.type === Msg.PING) return pong(c, f);
      if (f.type === Msg.EXEC && c.n === 0) {
        c.sock.write(encodeFrame(Msg.STARTED, f.stream, [[Tag.PID, 9]]));
        c.sock.write(GARBAGE);
      }
    },
    async (agent, conns) => {
      const ex = agent.exec({ argv: ["sleep", "100"] });
      await assert.rejects(ex.result, (e: unknown) => {
        assert.ok(isCode("agent_protocol")(e));
        assert.match((e as Error).message, /corrupted its agent channel/);
        return true;
      });
      // Sent while reconnecting: queued, answered on the new connection.
      assert.equal((await agent.ping(5_000)).version, 1);
      assert.equal(agent.closed, false);
      assert.equal(conns.length, 2);
      // The exec that failed under the garbage is stopped in the guest.
      const stream = conns[0]!.frames.find((f) => f.type === Msg.EXEC)!.stream;
      assert.ok(conns[1]!.frames.some((f) => f.type === Msg.CANCEL && f.stream === stream));
    },
  );
});

test("garbage again and again: past the bound the client reports the channel broken", async () => {
  await fakeGuest(
    (c, f) => {
      if (f.type === Msg.PING) c.sock.write(GARBAGE);
    },
    async (agent, conns) => {
      const broken = new Promise<string>((r) => agent.once("broken", r));
      await assert.rejects(agent.ping(10_000), isCode("agent_protocol"));
      const reason = await broken;
      assert.match(reason, /corrupted its agent channel \d+ times/);
      assert.equal(agent.closed, true);
      assert.ok(conns.length >= 3 && conns.length <= 5, `${conns.length} connections`);
      await assert.rejects(agent.ping(1_000), isCode("agent_protocol"));
    },
  );
});

test("an exec the guest never starts ends at its STARTED deadline, without timeout_ms", async () => {
  await fakeGuest(
    (c, f) => {
      if (f.type === Msg.PING) pong(c, f);
    },
    async (agent, conns) => {
      const t0 = Date.now();
      await assert.rejects(agent.exec({ argv: ["x"], startTimeoutMs: 300 }).result, isCode("timeout"));
      assert.ok(Date.now() - t0 < 5_000);
      await sleep(100);
      assert.ok(
        conns[0]!.frames.some((f) => f.type === Msg.CANCEL),
        "the guest is told to drop it",
      );
    },
  );
});

test("a write whose guest stops reading ends at its deadline and stops sending", async () => {
  await fakeGuest(
    (c, f) => {
      if (f.type === Msg.PING) return pong(c, f);
      if (f.type === Msg.WRITE_OPEN) c.sock.pause(); // never reads again (until the test says)
      return;
    },
    async (agent, conns) => {
      const t0 = Date.now();
      await assert.rejects(
        agent.writeFile("/x", new Uint8Array(256 << 20), { timeoutMs: 500 }),
        isCode("timeout"),
      );
      assert.ok(Date.now() - t0 < 5_000, "the drain did not hold it past its deadline");
      // What reaches the guest afterwards: the rest stopped, a CANCEL, and no WRITE_END.
      const c = conns[0]!;
      c.sock.resume();
      await sleep(500);
      const data = c.frames.filter((f) => f.type === Msg.WRITE_DATA).length;
      assert.ok(data < (256 << 20) / CHUNK, `sent ${data} chunks of 4096`);
      assert.ok(c.frames.some((f) => f.type === Msg.CANCEL));
      assert.ok(!c.frames.some((f) => f.type === Msg.WRITE_END));
    },
  );
});

test("a write whose upload never ends stops at its deadline and closes the upload", async () => {
  await fakeGuest(
    (c, f) => {
      if (f.type === Msg.PING) pong(c, f);
    },
    async (agent, conns) => {
      let closed = false;
      async function* upload() {
        try {
          for (;;) {
            yield new Uint8Array(1000);
            await sleep(50); // a slow client that never finishes
          }
        } finally {
          closed = true;
        }
      }
      const t0 = Date.now();
      await assert.rejects(agent.writeFile("/y", upload(), { timeoutMs: 300 }), isCode("timeout"));
      assert.ok(Date.now() - t0 < 3_000);
      await sleep(200);
      assert.ok(closed, "the upload was closed");
      const c = conns[0]!;
      assert.ok(c.frames.some((f) => f.type === Msg.CANCEL));
      const n = c.frames.filter((f) => f.type === Msg.WRITE_DATA).length;
      await sleep(200);
      assert.equal(c.frames.filter((f) => f.type === Msg.WRITE_DATA).length, n, "nothing sent after");
    },
  );
});

test("the flow ack: a paced agent gets WINDOW credit as the consumer drains", async () => {
  await fakeGuest(
    (c, f) => {
      if (f.type === Msg.PING) return pong(c, f);
      if (f.type !== Msg.READ) return;
      const w = intField(f.fields, Tag.WINDOW)!;
      assert.ok(w > 0);
      c.sock.write(
        encodeFrame(Msg.DATA, f.stream, [
          [Tag.WINDOW, w],
          [Tag.DATA, Buffer.alloc(CHUNK)],
        ]),
      );
      for (let sent = CHUNK; sent < w; sent += CHUNK)
        c.sock.write(encodeFrame(Msg.DATA, f.stream, [[Tag.DATA, Buffer.alloc(CHUNK)]]));
    },
    async (agent, conns) => {
      let got = 0;
      const reading = agent.readFileStream("/z", (d) => void (got += d.length), 2_000);
      // Handled here so that a failed assertion below is the failure reported, not the rejection
      // of the read when the fake guest closes; the read's result is still asserted at the end.
      reading.catch(() => undefined);
      const credited = () =>
        conns[0]!.frames
          .filter((f) => f.type === Msg.WINDOW)
          .reduce((n, f) => n + intField(f.fields, Tag.WINDOW)!, 0);
      // The guest sends one whole window; credit comes back in batches as it is consumed, so
      // wait until all of it is consumed and credited (a window is a whole number of batches).
      for (let i = 0; i < 250 && (got < WINDOW || credited() < got); i++) await sleep(20);
      const credit = conns[0]!.frames.filter((f) => f.type === Msg.WINDOW);
      assert.ok(credit.length > 0, "credit returned");
      assert.equal(got, WINDOW, "the whole window was consumed");
      assert.equal(credited(), got, "exactly what was consumed");
      conns[0]!.sock.write(encodeFrame(Msg.END, credit[0]!.stream, [[Tag.SIZE, got]]));
      assert.equal(await reading, got);
    },
  );
});
