/**
 * The host client's side of PTY execs and watches against a scripted guest: the fields on the
 * wire, an agent older than them (it runs a PTY command on pipes, it does not know WATCH), a
 * guest that never answers, a connection dropped mid-watch, and what a hostile guest may send
 * in a watch's stream.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import type { Socket } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AgentClient } from "../../src/agent/client.js";
import type { WatchEvent } from "../../src/agent/client.js";
import { FrameDecoder, Msg, Tag, encodeFrame, intField, strField } from "../../src/agent/codec.js";
import type { FieldInput, Frame } from "../../src/agent/codec.js";
import { ForkdError } from "../../src/util/errors.js";

type Script = (f: Frame, send: (type: number, fields?: FieldInput[]) => void, sock: Socket) => void;

/** A scripted guest: `script` sees each frame but PING (answered) and may reply on its stream. */
async function withGuest(script: Script, fn: (a: AgentClient, seen: Frame[]) => Promise<void>) {
  const dir = await mkdtemp(join(tmpdir(), "forkd-watch-client-"));
  const path = join(dir, "agent.sock");
  const seen: Frame[] = [];
  const socks: Socket[] = [];
  const server = createServer((sock) => {
    socks.push(sock);
    const dec = new FrameDecoder();
    sock.on("data", (d: Buffer) => {
      for (const f of dec.push(d)) {
        const send = (type: number, fields: FieldInput[] = []) =>
          sock.write(encodeFrame(type, f.stream, fields));
        if (f.type === Msg.PING) {
          send(Msg.OK, [[Tag.VERSION, 1]]);
          continue;
        }
        seen.push(f);
        script(f, send, sock);
      }
    });
    sock.on("error", () => undefined);
  });
  await new Promise<void>((r) => server.listen(path, r));
  const agent = await AgentClient.connect(path, 2_000);
  try {
    await fn(agent, seen);
  } finally {
    agent.close();
    for (const s of socks) s.destroy();
    server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const isCode = (code: string) => (e: unknown) => e instanceof ForkdError && e.code === code;
const until = async (cond: () => boolean) => {
  for (let i = 0; i < 200 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(cond());
};

test("a PTY exec sends STDIN=1, PTY_ROWS and PTY_COLS; resize sends RESIZE on its stream", async () => {
  await withGuest(
    (f, send) => {
      if (f.type === Msg.EXEC)
        send(Msg.STARTED, [
          [Tag.PID, 9],
          [Tag.PTY_ROWS, intField(f.fields, Tag.PTY_ROWS)!],
          [Tag.PTY_COLS, intField(f.fields, Tag.PTY_COLS)!],
        ]);
      if (f.type === Msg.RESIZE) send(Msg.EXIT, [[Tag.EXIT_CODE, 0]]);
    },
    async (agent, seen) => {
      const h = agent.exec({ argv: ["bash"], pty: { rows: 25, cols: 81 } });
      assert.deepEqual(await h.started, { pid: 9 });
      h.resize(50, 100);
      assert.equal((await h.result).exitCode, 0);
      const [exec, resize] = seen;
      assert.equal(intField(exec!.fields, Tag.STDIN), 1);
      assert.equal(intField(exec!.fields, Tag.PTY_ROWS), 25);
      assert.equal(intField(exec!.fields, Tag.PTY_COLS), 81);
      assert.equal(resize!.type, Msg.RESIZE);
      assert.equal(resize!.stream, exec!.stream);
      assert.equal(intField(resize!.fields, Tag.PTY_ROWS), 50);
      assert.equal(intField(resize!.fields, Tag.PTY_COLS), 100);
      assert.throws(
        () => agent.exec({ argv: ["x"], pty: { rows: 0, cols: 80 } }),
        isCode("invalid_argument"),
      );
      assert.throws(
        () => agent.exec({ argv: ["x"], pty: { rows: 24, cols: 70_000 } }),
        isCode("invalid_argument"),
      );
    },
  );
});

test("an agent older than PTYs (STARTED without the size): unavailable, and the command is cancelled", async () => {
  await withGuest(
    (f, send) => {
      if (f.type === Msg.EXEC) send(Msg.STARTED, [[Tag.PID, 9]]);
    },
    async (agent, seen) => {
      const h = agent.exec({ argv: ["bash"], pty: { rows: 24, cols: 80 } });
      await assert.rejects(h.result, isCode("unavailable"));
      await until(() => seen.some((f) => f.type === Msg.CANCEL));
    },
  );
});

test("WATCH carries PATH, RECURSIVE and WINDOW; events decode; END resolves done", async () => {
  await withGuest(
    (f, send) => {
      if (f.type !== Msg.WATCH) return;
      send(Msg.OK, [[Tag.WINDOW, 1 << 20]]);
      send(Msg.WATCH_EVENT, [
        [Tag.EVENT, "create"],
        [Tag.PATH, "/w/a"],
        [Tag.FILE_TYPE, 1],
      ]);
      send(Msg.WATCH_EVENT, [
        [Tag.EVENT, "create"],
        [Tag.PATH, "/w/d"],
        [Tag.FILE_TYPE, 2],
      ]);
      send(Msg.END);
    },
    async (agent, seen) => {
      const events: WatchEvent[] = [];
      const w = agent.watch("/w", { recursive: true }, (e) => void events.push(e));
      await w.ready;
      await w.done;
      assert.deepEqual(events, [
        { type: "create", path: "/w/a", isDir: false },
        { type: "create", path: "/w/d", isDir: true },
      ]);
      const [req] = seen;
      assert.equal(strField(req!.fields, Tag.PATH), "/w");
      assert.equal(intField(req!.fields, Tag.RECURSIVE), 1);
      assert.ok((intField(req!.fields, Tag.WINDOW) ?? 0) > 0);
    },
  );
});

test("stop() cancels the watch in the guest and resolves done; ENOSYS (an old agent) is unavailable", async () => {
  await withGuest(
    (f, send) => {
      if (f.type === Msg.WATCH && strField(f.fields, Tag.PATH) === "/old")
        send(Msg.ERROR, [
          [Tag.ERRNO, 38],
          [Tag.MESSAGE, "unknown request type 0x29"],
        ]);
      else if (f.type === Msg.WATCH) send(Msg.OK);
    },
    async (agent, seen) => {
      const w = agent.watch("/w", {}, () => undefined);
      await w.ready;
      w.stop();
      w.stop();
      await w.done;
      await until(() => seen.filter((f) => f.type === Msg.CANCEL).length === 1);
      const old = agent.watch("/old", {}, () => undefined);
      await assert.rejects(old.ready, isCode("unavailable"));
      await assert.rejects(old.done, isCode("unavailable"));
    },
  );
});

test("a guest that never answers WATCH: ready and done time out (and the guest is told to cancel)", async () => {
  await withGuest(
    () => undefined,
    async (agent, seen) => {
      const w = agent.watch("/w", { readyTimeoutMs: 200 }, () => undefined);
      await assert.rejects(w.ready, isCode("timeout"));
      await assert.rejects(w.done, isCode("timeout"));
      await until(() => seen.some((f) => f.type === Msg.CANCEL));
    },
  );
});

test("a connection dropped mid-watch settles done with an error", async () => {
  await withGuest(
    (f, send, sock) => {
      if (f.type !== Msg.WATCH) return;
      send(Msg.OK);
      send(Msg.WATCH_EVENT, [
        [Tag.EVENT, "write"],
        [Tag.PATH, "/w/a"],
      ]);
      setTimeout(() => sock.destroy(), 50);
    },
    async (agent) => {
      const events: WatchEvent[] = [];
      const w = agent.watch("/w", {}, (e) => void events.push(e));
      await w.ready;
      await assert.rejects(w.done, (e: unknown) => e instanceof ForkdError);
      assert.deepEqual(events, [{ type: "write", path: "/w/a" }]);
    },
  );
});

for (const [what, fields] of [
  [
    "an unknown event type",
    [
      [Tag.EVENT, "explode"],
      [Tag.PATH, "/w/a"],
    ],
  ],
  ["an event without a path", [[Tag.EVENT, "create"]]],
  [
    "a relative path",
    [
      [Tag.EVENT, "create"],
      [Tag.PATH, "a"],
    ],
  ],
  [
    "a path longer than PATH_MAX",
    [
      [Tag.EVENT, "create"],
      [Tag.PATH, "/" + "a".repeat(5000)],
    ],
  ],
  [
    "a malformed FILE_TYPE",
    [
      [Tag.EVENT, "create"],
      [Tag.PATH, "/w/a"],
      [Tag.FILE_TYPE, "xy"],
    ],
  ],
] as [string, FieldInput[]][]) {
  test(`a hostile guest's watch event (${what}) is a protocol error: done rejects, nothing delivered`, async () => {
    await withGuest(
      (f, send) => {
        if (f.type !== Msg.WATCH) return;
        send(Msg.OK);
        send(Msg.WATCH_EVENT, fields);
      },
      async (agent) => {
        const events: WatchEvent[] = [];
        const w = agent.watch("/w", {}, (e) => void events.push(e));
        await assert.rejects(w.done, isCode("agent_protocol"));
        assert.deepEqual(events, []);
      },
    );
  });
}
