/**
 * The client's side of exec users and kernels against a scripted guest: the USER and LANGUAGE
 * fields on the wire, PING's KERNELS, and an agent older than them (its PING has no KERNELS),
 * which would ignore USER and LANGUAGE: the client refuses instead of running the command as
 * root or the cell in Python. The same for file requests as a user (PING's FEATURES file-user).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import type { Socket } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AgentClient } from "../../src/agent/client.js";
import { FrameDecoder, Msg, Tag, encodeFrame, intField, strField } from "../../src/agent/codec.js";
import type { FieldInput, Frame } from "../../src/agent/codec.js";
import { ForkdError } from "../../src/util/errors.js";

const EVAL_JSON = JSON.stringify({ ok: true, value: "2", stdout: "", stderr: "", error: null });

/** A scripted guest: answers PING (with KERNELS unless `kernels` is null), EXEC and EVAL. */
async function withGuest(
  kernels: string | null,
  fn: (a: AgentClient, seen: Frame[]) => Promise<void>,
  evalError?: { errno: number; message: string },
  features?: string,
) {
  const dir = await mkdtemp(join(tmpdir(), "forkd-features-"));
  const path = join(dir, "agent.sock");
  const seen: Frame[] = [];
  const answer = (sock: Socket, f: Frame) => {
    const send = (type: number, fields: FieldInput[] = []) => sock.write(encodeFrame(type, f.stream, fields));
    seen.push(f);
    if (f.type === Msg.PING) {
      const fields: FieldInput[] = [
        [Tag.VERSION, 1],
        [Tag.UPTIME_MS, 5],
        [Tag.EVAL_READY, 1],
      ];
      if (kernels !== null) fields.push([Tag.KERNELS, kernels]);
      if (features !== undefined) fields.push([Tag.FEATURES, features]);
      send(Msg.OK, fields);
    } else if (f.type === Msg.EXEC) {
      send(Msg.STARTED, [[Tag.PID, 7]]);
      send(Msg.EXIT, [
        [Tag.EXIT_CODE, 0],
        [Tag.TIMED_OUT, 0],
      ]);
    } else if (f.type === Msg.EVAL && evalError) {
      send(Msg.ERROR, [
        [Tag.ERRNO, evalError.errno],
        [Tag.MESSAGE, evalError.message],
      ]);
    } else if (f.type === Msg.EVAL) send(Msg.OK, [[Tag.JSON, EVAL_JSON]]);
    else if (f.type === Msg.READ) {
      send(Msg.DATA, [[Tag.DATA, "abc"]]);
      send(Msg.END, [[Tag.SIZE, 3]]);
    } else if (f.type === Msg.STAT)
      send(Msg.OK, [
        [Tag.FILE_TYPE, 1],
        [Tag.SIZE, 3],
      ]);
    else if (f.type === Msg.WRITE_END) send(Msg.OK, [[Tag.SIZE, 3]]);
    else if (f.type === Msg.WATCH) send(Msg.OK);
    else if (f.type !== Msg.WRITE_OPEN && f.type !== Msg.WRITE_DATA && f.type !== Msg.CANCEL) send(Msg.OK);
  };
  const server = createServer((sock) => {
    const dec = new FrameDecoder();
    sock.on("data", (d: Buffer) => {
      for (const f of dec.push(d)) answer(sock, f);
    });
    sock.on("error", () => undefined);
  });
  await new Promise<void>((r) => server.listen(path, r));
  const agent = await AgentClient.connect(path, 2_000);
  try {
    await fn(agent, seen);
  } finally {
    agent.close();
    server.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const types = (seen: Frame[]) => seen.map((f) => f.type);

test("exec `user` and eval `language` go on the wire as USER (21) and LANGUAGE (22); python is not named", async () => {
  await withGuest("python,javascript", async (agent, seen) => {
    assert.equal(Tag.USER, 21);
    assert.equal(Tag.LANGUAGE, 22);
    assert.equal(Tag.KERNELS, 47);
    assert.deepEqual((await agent.ping()).kernels, ["python", "javascript"]);
    const r = await agent.exec({ argv: ["id"], user: "nobody:nogroup" }).result;
    assert.equal(r.exitCode, 0);
    const exec = seen.find((f) => f.type === Msg.EXEC)!;
    assert.equal(strField(exec.fields, Tag.USER), "nobody:nogroup");
    await agent.exec({ argv: ["id"] }).result;
    assert.equal(strField(seen.filter((f) => f.type === Msg.EXEC)[1]!.fields, Tag.USER), undefined);
    assert.equal((await agent.eval("1+1", 1_000, "javascript")).value, "2");
    assert.equal((await agent.eval("1+1", 1_000)).value, "2");
    const evals = seen.filter((f) => f.type === Msg.EVAL);
    assert.equal(strField(evals[0]!.fields, Tag.LANGUAGE), "javascript");
    assert.equal(strField(evals[1]!.fields, Tag.LANGUAGE), undefined);
    assert.equal(intField(evals[1]!.fields, Tag.TIMEOUT_MS), 1_000);
    // the agent was asked what it supports once, by the first request that needed it
    assert.equal(types(seen).filter((t) => t === Msg.PING).length, 2);
  });
});

test("an agent older than kernels: exec as a user and eval in JavaScript are unavailable, nothing is run", async () => {
  await withGuest(null, async (agent, seen) => {
    assert.equal((await agent.ping()).kernels, null);
    const h = agent.exec({ shell: "id", user: "nobody", stdin: true });
    h.writeStdin(Buffer.from("x")); // before the check: dropped with the exec
    h.closeStdin();
    const e = await h.result.catch((x: unknown) => x);
    assert.ok(e instanceof ForkdError && e.code === "unavailable", String(e));
    assert.match(e.message, /exec as a user needs a newer guest agent/);
    await assert.rejects(h.started, (x: unknown) => x instanceof ForkdError && x.code === "unavailable");
    await assert.rejects(
      agent.eval("1", 1_000, "javascript"),
      (x: unknown) => x instanceof ForkdError && x.code === "unavailable",
    );
    // what the old agent does understand still works
    assert.equal((await agent.exec({ argv: ["true"] }).result).exitCode, 0);
    assert.equal((await agent.eval("1+1", 1_000)).value, "2");
    assert.deepEqual(
      types(seen).filter((t) => t !== Msg.PING),
      [Msg.EXEC, Msg.EVAL],
    );
  });
});

test("a gated exec passes on stdin, close and signals given before it started, in order", async () => {
  await withGuest("python", async (agent, seen) => {
    const h = agent.exec({ shell: "cat", user: "root", stdin: true });
    h.writeStdin(Buffer.from("abc"));
    h.closeStdin();
    assert.equal((await h.started).pid, 7);
    await h.result;
    const after = seen.filter((f) => f.type !== Msg.PING);
    assert.deepEqual(
      after.map((f) => f.type),
      [Msg.EXEC, Msg.STDIN, Msg.STDIN],
    );
    assert.equal(strField(after[1]!.fields, Tag.DATA), "abc");
    assert.equal(strField(after[2]!.fields, Tag.DATA), undefined);
  });
});

test("the guest's ENOENT for an eval (no interpreter, no kernel source) is unavailable with its words", async () => {
  const message = "no node interpreter in this image (eval needs node or nodejs on PATH)";
  await withGuest(
    "python",
    async (agent) => {
      const e = await agent.eval("1", 1_000, "javascript").catch((x: unknown) => x);
      assert.ok(e instanceof ForkdError, String(e));
      assert.deepEqual(
        [e.code, e.message, e.details.errno, e.details.language],
        ["unavailable", message, 2, "javascript"],
      );
    },
    { errno: 2, message },
  );
});

test("file requests as a user carry USER to an agent with FEATURES file-user; root's carry none", async () => {
  await withGuest(
    "python",
    async (agent, seen) => {
      assert.equal(Tag.FEATURES, 51);
      assert.deepEqual((await agent.ping()).features, ["file-user", "later-thing"]);
      assert.equal(await agent.fileUsers(), true);
      assert.equal((await agent.readFile("/etc/shadow", { user: "user" })).toString(), "abc");
      assert.equal((await agent.stat("/x", undefined, "user")).size, 3);
      await agent.list("/d", undefined, "user");
      await agent.mkdir("/d/e", { parents: true, user: "user" });
      await agent.remove("/d", { recursive: true, user: "user" });
      await agent.rename("/a", "/b", undefined, "user");
      assert.equal(await agent.writeFile("/f", Buffer.from("abc"), { user: "user" }), 3);
      const w = agent.watch("/d", { user: "user" }, () => undefined);
      await w.ready;
      w.stop();
      await agent.stat("/x");
      const files = seen.filter(
        (f) => f.type !== Msg.PING && f.type !== Msg.WRITE_DATA && f.type !== Msg.CANCEL,
      );
      assert.deepEqual(
        files.map((f) => f.type),
        [
          Msg.READ,
          Msg.STAT,
          Msg.LIST,
          Msg.MKDIR,
          Msg.REMOVE,
          Msg.RENAME,
          Msg.WRITE_OPEN,
          Msg.WRITE_END,
          Msg.WATCH,
          Msg.STAT,
        ],
      );
      for (const f of files.slice(0, 9))
        if (f.type !== Msg.WRITE_END)
          assert.equal(strField(f.fields, Tag.USER), "user", `0x${f.type.toString(16)}`);
      assert.equal(strField(files[9]!.fields, Tag.USER), undefined, "without a user: the agent's own (root)");
    },
    undefined,
    "file-user,later-thing,Bad Name",
  );
});

test("an agent older than file users: a file request as a user is unavailable and never sent", async () => {
  await withGuest("python", async (agent, seen) => {
    const old = (x: unknown) =>
      x instanceof ForkdError && x.code === "unavailable" && /newer guest agent/.test(x.message);
    const w0 = () => agent.watch("/d", { user: "user" }, () => undefined).ready;
    await assert.rejects(w0(), old, "a watch asked before anything else waits for the agent's answer");
    assert.equal(await agent.fileUsers(), false);
    assert.deepEqual((await agent.ping()).features, []);
    await assert.rejects(agent.readFile("/etc/shadow", { user: "user" }), old);
    await assert.rejects(
      agent.readFileStream("/etc/shadow", () => undefined, undefined, "user"),
      old,
    );
    await assert.rejects(agent.stat("/x", undefined, "user"), old);
    await assert.rejects(agent.list("/x", undefined, "user"), old);
    await assert.rejects(agent.mkdir("/x", { user: "user" }), old);
    await assert.rejects(agent.remove("/x", { user: "user" }), old);
    await assert.rejects(agent.rename("/x", "/y", undefined, "user"), old);
    await assert.rejects(agent.writeFile("/x", Buffer.from("a"), { user: "user" }), old);
    await assert.rejects(w0(), old);
    // as root (no user), the old agent serves files as before
    assert.equal((await agent.readFile("/etc/hostname")).toString(), "abc");
    assert.deepEqual(
      types(seen).filter((t) => t !== Msg.PING),
      [Msg.READ],
    );
  });
});
