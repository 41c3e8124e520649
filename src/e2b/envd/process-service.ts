/**
 * envd's process service (process.Process) over a sandbox's guest agent: Start runs a command
 * (argv, envs, cwd, user, stdin, PTY) and streams its events; Connect attaches to a running one;
 * List, SendInput, StreamInput, SendSignal, CloseStdin and Update (PTY size) act on one by pid
 * or tag. A stream's client that hangs up frees the stream, never the process: it runs on, as
 * under E2B's envd, until it exits or the call's deadline (Connect-Timeout-Ms) kills it.
 */
import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { ExecRequest } from "../../agent/client.js";
import { withStartExplained } from "../../agent/exec-start.js";
import { ForkdError } from "../../util/errors.js";
import { CommandTap } from "../../sandbox/command-tap.js";
import type { Lease } from "../../sandbox/lease.js";
import { resolvePath } from "./accounts.js";
import type { EnvdState } from "./context.js";
import { keepaliveMs, leaseAs, sandboxOf } from "./context.js";
import { toConnectError } from "./errors.js";
import type { EventQueue } from "./event-queue.js";
import { ProcessEventSchema, Signal } from "./gen/process/process_pb.js";
import type { ProcessEvent, ProcessSelector, StartRequest, Process } from "./gen/process/process_pb.js";
import { EnvdProcess, MAX_PROCESSES, endEvent } from "./process-table.js";
import type { ProcEvent } from "./process-table.js";

type ProcessImpl = ServiceImpl<typeof Process>;

const MAX_ARGS = 4096;
const MAX_ENVS = 1024;
const MAX_TAG = 256;

/** The wire's ProcessEvent of one of ours. */
function toWire(e: ProcEvent): ProcessEvent {
  switch (e.type) {
    case "start":
      return create(ProcessEventSchema, { event: { case: "start", value: { pid: e.pid } } });
    case "data":
      return create(ProcessEventSchema, {
        event: { case: "data", value: { output: { case: e.stream, value: e.data } } },
      });
    case "end":
      return create(ProcessEventSchema, {
        event: {
          case: "end",
          value: { exitCode: e.exitCode, exited: e.exited, status: e.status, error: e.error },
        },
      });
  }
}

const keepalive = (): ProcessEvent => create(ProcessEventSchema, { event: { case: "keepalive", value: {} } });

function selectorOf(sel: ProcessSelector | undefined): { pid?: number; tag?: string } {
  if (sel?.selector.case === "pid") return { pid: sel.selector.value };
  if (sel?.selector.case === "tag") return { tag: sel.selector.value };
  throw new ForkdError("invalid_argument", "process selector must name a pid or a tag");
}

function checkStart(req: StartRequest): NonNullable<StartRequest["process"]> {
  const p = req.process;
  if (!p || p.cmd === "") throw new ForkdError("invalid_argument", "process.cmd is required");
  if (p.args.length > MAX_ARGS) throw new ForkdError("invalid_argument", `more than ${MAX_ARGS} args`);
  if (Object.keys(p.envs).length > MAX_ENVS)
    throw new ForkdError("invalid_argument", `more than ${MAX_ENVS} envs`);
  if (req.tag !== undefined && req.tag.length > MAX_TAG)
    throw new ForkdError("invalid_argument", `tag longer than ${MAX_TAG} characters`);
  const size = req.pty?.size;
  if (req.pty && (!size || size.rows === 0 || size.cols === 0))
    throw new ForkdError("invalid_argument", "pty.size needs rows and cols");
  return p;
}

/** The events of `q` as a stream's responses: start first, keepalives while idle, until the end. */
async function* follow(
  p: EnvdProcess,
  q: EventQueue<ProcEvent>,
  ctx: HandlerContext,
): AsyncGenerator<{ event: ProcessEvent }> {
  try {
    yield { event: toWire({ type: "start", pid: p.pid }) };
    const every = keepaliveMs(ctx);
    for (;;) {
      const n = await q.next(every, ctx.signal);
      if (n === null) return;
      yield { event: "keepalive" in n ? keepalive() : toWire(n.event) };
    }
  } catch (e) {
    throw toConnectError(e);
  } finally {
    p.detach(q);
  }
}

/**
 * A command the sandbox tracks that envd did not start (forkd's API started it, or a restarted
 * daemon found it running in the guest): an envd process from now on, fed by a reader of its
 * output (which never holds it back). Null: the sandbox tracks no such command.
 */
function fromCommands(st: EnvdState, sandboxId: string, pid: number): EnvdProcess | null {
  const table = st.s.sandboxes.get(sandboxId).commands;
  let c;
  try {
    c = table.get(pid);
  } catch {
    return null;
  }
  const argv = typeof c.cmd === "string" ? ["/bin/sh", "-c", c.cmd] : c.cmd;
  const p = new EnvdProcess(
    { cmd: argv[0] ?? "", args: argv.slice(1), envs: {} },
    undefined,
    c.pty,
    false,
    c.handle,
  );
  p.stdinOpen = c.stdinOpen;
  p.pid = pid;
  st.processes.add(sandboxId, p);
  const out = c.pty ? "pty" : "stdout";
  const over = (fn: () => void) => {
    fn();
    st.processes.remove(sandboxId, p);
  };
  table.attach(pid, {
    output: (stream, d) => {
      void p.output(stream === "stdout" ? out : "stderr", d);
      return true;
    },
    drained: () => Promise.resolve(),
    exit: (r) => over(() => p.finish(endEvent(r))),
    error: (e) => over(() => p.fail(e)),
    cut: () =>
      over(() => p.fail(new ForkdError("resource_exhausted", `process ${pid}'s reader fell behind`))),
  });
  return p;
}

export function processService(st: EnvdState): ProcessImpl {
  const find = (ctx: HandlerContext, sel: ProcessSelector | undefined) => {
    try {
      const id = sandboxOf(ctx);
      const s = selectorOf(sel);
      try {
        return st.processes.find(id, s);
      } catch (e) {
        const p = s.pid !== undefined ? fromCommands(st, id, s.pid) : null;
        if (!p) throw e;
        return p;
      }
    } catch (e) {
      throw toConnectError(e);
    }
  };

  return {
    async *start(req, ctx) {
      const id = sandboxOf(ctx);
      let p: EnvdProcess;
      let started: Promise<{ pid: number }>;
      // Released here on any failure until the command's end is wired to release it.
      let unwired: Lease | null = null;
      try {
        const cfg = checkStart(req);
        if (st.processes.count(id) >= MAX_PROCESSES)
          throw new ForkdError("resource_exhausted", `sandbox ${id} runs ${MAX_PROCESSES} envd processes`);
        const { lease, account } = await leaseAs(st, ctx);
        unwired = lease;
        const cwd = resolvePath(cfg.cwd ?? account.home, account);
        const timeoutMs = ctx.timeoutMs();
        const size = req.pty?.size;
        const er: ExecRequest = {
          argv: [cfg.cmd, ...cfg.args],
          env: { HOME: account.home, USER: account.name, LOGNAME: account.name, ...cfg.envs },
          cwd,
          user: account.name,
          stdin: req.stdin ?? true,
          ...(timeoutMs !== undefined && timeoutMs > 0 ? { timeoutMs } : {}),
          ...(size ? { pty: { rows: size.rows, cols: size.cols } } : {}),
        };
        p = new EnvdProcess(
          { cmd: cfg.cmd, args: cfg.args, envs: cfg.envs, ...(cfg.cwd !== undefined ? { cwd } : {}) },
          req.tag,
          size !== undefined,
          er.stdin === true,
        );
        const proc = p;
        const out = proc.pty ? "pty" : "stdout";
        // Tracked with the sandbox's commands (forkd's API lists it too): the handle lasts
        // through a pause and resume, its output still going to this process's streams.
        const tap = new CommandTap();
        const fed = tap.handlers({
          onStdout: (d) => proc.output(out, d),
          onStderr: (d) => proc.output("stderr", d),
        });
        const inner = withStartExplained(lease.agent, er, lease.agent.exec(er, fed), lease.explain);
        const h = lease.commands.track([cfg.cmd, ...cfg.args], proc.stdinOpen, inner, proc.pty, tap, fed);
        proc.exec = h;
        started = h.started.then((s) => {
          proc.pid = s.pid;
          st.processes.add(id, proc);
          return s;
        });
        h.result
          .then(
            (r) => proc.finish(endEvent(r)),
            (e: unknown) => proc.fail(e),
          )
          .finally(() => {
            st.processes.remove(id, proc);
            lease.release();
          })
          .catch(() => undefined);
        unwired = null;
      } catch (e) {
        unwired?.release();
        throw toConnectError(e);
      }
      // Attached before the start: no output is missed. Detached however this generator ends
      // (follow's own finally, a failed start, or a client gone while the start was awaited).
      const q = p.attach();
      try {
        try {
          await started;
        } catch (e) {
          throw toConnectError(e);
        }
        yield* follow(p, q, ctx);
      } finally {
        p.detach(q);
      }
    },

    async *connect(req, ctx) {
      const p = find(ctx, req.process);
      let q: EventQueue<ProcEvent>;
      try {
        q = p.attach();
      } catch (e) {
        throw toConnectError(e);
      }
      yield* follow(p, q, ctx);
    },

    async list(_req, ctx) {
      const id = sandboxOf(ctx);
      // Every command the sandbox runs, as E2B's envd lists what it started.
      const known = new Set(st.processes.list(id).map((p) => p.pid));
      for (const c of st.s.sandboxes.get(id).commands.list())
        if (!known.has(c.pid)) fromCommands(st, id, c.pid);
      const processes = st.processes.list(id).map((p) => ({
        pid: p.pid,
        tag: p.tag,
        config: { cmd: p.config.cmd, args: p.config.args, envs: p.config.envs, cwd: p.config.cwd },
      }));
      return { processes };
    },

    async sendInput(req, ctx) {
      const p = find(ctx, req.process);
      const input = req.input?.input;
      if (!input?.case) return {};
      if (!p.stdinOpen)
        throw toConnectError(
          new ForkdError("conflict", `process ${p.pid} was started without stdin, or it was closed`),
        );
      p.exec.writeStdin(input.value);
      return {};
    },

    async streamInput(reqs, ctx) {
      let p: EnvdProcess | null = null;
      for await (const r of reqs) {
        if (r.event.case === "start") p = find(ctx, r.event.value.process);
        else if (r.event.case === "data") {
          if (!p) throw toConnectError(new ForkdError("invalid_argument", "data before the start event"));
          const input = r.event.value.input?.input;
          if (input?.case && p.stdinOpen && !p.ended) p.exec.writeStdin(input.value);
        }
      }
      return {};
    },

    async sendSignal(req, ctx) {
      const p = find(ctx, req.process);
      if (req.signal !== Signal.SIGKILL && req.signal !== Signal.SIGTERM)
        throw toConnectError(new ForkdError("invalid_argument", "signal must be SIGKILL or SIGTERM"));
      p.exec.signal(req.signal);
      return {};
    },

    async closeStdin(req, ctx) {
      const p = find(ctx, req.process);
      if (p.pty)
        throw toConnectError(
          new ForkdError("invalid_argument", "a PTY has no stdin to close: send Ctrl-D (0x04) instead"),
        );
      if (p.stdinOpen) p.exec.closeStdin();
      p.stdinOpen = false;
      return {};
    },

    async update(req, ctx) {
      const p = find(ctx, req.process);
      const size = req.pty?.size;
      if (!size) return {};
      if (!p.pty) throw toConnectError(new ForkdError("invalid_argument", `process ${p.pid} has no PTY`));
      try {
        p.exec.resize(size.rows, size.cols);
      } catch (e) {
        throw toConnectError(e);
      }
      return {};
    },
  };
}
