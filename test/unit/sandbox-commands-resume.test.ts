/**
 * Commands that run through a pause and resume, and through a daemon restart, on the fake VMM
 * (the real guest agent on the host): they stay listed, their owner's handle goes on (its
 * output, its exit), a reader attached after the resume gets their later output, they can be
 * signalled, and every exec after the resume starts (no stream id the guest still holds is
 * reused: the agent answered such a one `stream N already in use`).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type { ExecHandlers, ExecRequest, ExecResult } from "../../src/agent/client.js";
import { startCommand } from "../../src/sandbox/commands/start.js";
import type { CommandReader } from "../../src/sandbox/commands/table.js";
import type { SandboxService } from "../../src/sandbox/service.js";
import { forkOne, sh, until, withSandboxes } from "../helpers/fake-sandboxes.js";

const TICKER = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.05; done";

/** A reader attached to command `pid` of `id`: what it got, and its end. */
function attachReader(svc: SandboxService, id: string, pid: number) {
  const got: string[] = [];
  let end: ExecResult | Error | null = null;
  const reader: CommandReader = {
    output: (_s, d) => {
      got.push(d.toString());
      return true;
    },
    drained: () => Promise.resolve(),
    exit: (r) => void (end = r),
    error: (e) => void (end = e instanceof Error ? e : new Error(String(e))),
    cut: () => void (end = new Error("cut")),
  };
  svc.get(id).commands.attach(pid, reader);
  return { got, end: () => end };
}

/** Starts `req` in `id` through the command registry (as REST's exec does): its handle. */
const start = (svc: SandboxService, id: string, req: ExecRequest, owner: ExecHandlers = {}) =>
  svc.use(id, async (agent, commands) =>
    Promise.resolve(
      startCommand({ agent, commands, explain: async (e) => e }, req, {
        spec: { door: "api" },
        keepStdinOpen: false,
        owner,
      }).handle,
    ),
  );

/** Several execs in a row, each must start and exit 0. */
async function execsWork(fx: Parameters<typeof sh>[0], id: string): Promise<void> {
  for (let i = 0; i < 5; i++) assert.equal((await sh(fx, id, `echo run ${i}`)).trim(), `run ${i}`);
}

test("a pause and resume keep the running commands: listed, owned, reattachable, signalable; execs start", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    const owner: string[] = [];
    const h = await start(fx.svc, id, { shell: TICKER }, { onStdout: (d) => void owner.push(d.toString()) });
    const { pid } = await h.started;
    await until("its first output", () => owner.join("").includes("tick 2"));
    await fx.svc.pause(id);
    assert.deepEqual(
      fx.svc
        .get(id)
        .commands.list()
        .map((c) => c.pid),
      [pid],
      "listed while paused: it runs on in the saved guest",
    );
    await fx.svc.resume(id);
    assert.deepEqual(
      fx.svc
        .get(id)
        .commands.list()
        .map((c) => [c.pid, c.cmd]),
      [[pid, TICKER]],
    );
    await execsWork(fx, id);
    // A reader attached now gets what it prints from now on; so does its owner.
    const r = attachReader(fx.svc, id, pid);
    const before = owner.length;
    await until("output to the reader", () => /tick \d+/.test(r.got.join("")));
    await until("output to its owner after the resume", () => owner.length > before);
    await fx.svc.use(id, async (_a, commands) => void commands.get(pid).handle.signal(15));
    const res = await h.result;
    assert.equal(res.signal, 15);
    await until("the reader's end", () => r.end() !== null);
    assert.equal((r.end() as ExecResult).signal, 15);
    assert.deepEqual(fx.svc.get(id).commands.list(), []);
    assert.equal(fx.svc.get(id).commands.history().at(-1)?.signal, 15);
    // Paused and resumed twice more: still no stream id is reused.
    await fx.svc.pause(id);
    await fx.svc.resume(id);
    await execsWork(fx, id);
  });
});

test("a command killed while its sandbox is paused ends with the sandbox", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    const h = await start(fx.svc, id, { shell: "sleep 300" });
    await h.started;
    await fx.svc.pause(id);
    await fx.svc.kill(id);
    await assert.rejects(h.result, /exited: killed/);
  });
});

test("a daemon restart: the new daemon tracks the commands its guest runs; execs start", async () => {
  await withSandboxes(async (fx) => {
    const id = await forkOne(fx);
    const h = await start(fx.svc, id, { argv: ["sh", "-c", TICKER] });
    const { pid } = await h.started;
    const svc = await fx.restart();
    assert.deepEqual((await svc.recover()).adopted, [id]);
    const listed = svc.get(id).commands.list();
    assert.deepEqual(
      listed.map((c) => [c.pid, c.cmd]),
      [[pid, ["sh", "-c", TICKER]]],
    );
    await execsWork(fx, id);
    const r = attachReader(svc, id, pid);
    await until("output to the reader", () => /tick \d+/.test(r.got.join("")));
    await svc.use(id, async (_a, commands) => void commands.get(pid).handle.signal(9));
    await until("the reader's end", () => r.end() !== null);
    assert.equal((r.end() as ExecResult).signal, 9);
    await execsWork(fx, id);
  });
});
