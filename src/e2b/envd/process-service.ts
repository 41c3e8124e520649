/**
 * envd's process service (process.Process) over the sandbox's command registry
 * (src/sandbox/commands/): Start runs a command (argv, envs, cwd, user, stdin, PTY) and streams
 * its events; Connect attaches to a running one; List, SendInput, StreamInput, SendSignal,
 * CloseStdin and Update (PTY size) act on one by pid or tag. Every command the sandbox runs is a
 * process here (REST's exec and terminal too), and every process started here is one of REST's
 * commands. A stream's client that hangs up frees the stream, never the process: it runs on, as
 * under E2B's envd, until it exits or the call's deadline (Connect-Timeout-Ms) kills it.
 */
import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { CommandRun } from "../../app/index.js";
import type { ExecRequest } from "../../agent/index.js";
import { startCommand } from "../../sandbox/index.js";
import { argvOf } from "../../sandbox/index.js";
import type { CommandTable, RunningCommand } from "../../sandbox/index.js";
import type { Lease } from "../../sandbox/index.js";
import { ForkdError } from "../../util/index.js";
import { resolvePath } from "./accounts.js";
import type { EnvdState } from "./context.js";
import { keepaliveMs, leaseAs, sandboxOf } from "./context.js";
import { toConnectError } from "./errors.js";
import { ProcessEventSchema, Signal } from "./gen/process/process_pb.js";
import type { ProcessEvent, ProcessSelector, StartRequest, Process } from "./gen/process/process_pb.js";
import { processStream } from "./process-events.js";
import type { ProcEvent, ProcessStream } from "./process-events.js";

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

function selectorOf(sel: ProcessSelector | undefined): { pid: number } | { tag: string } {
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

/** A stream's events as its responses: start first, keepalives while idle, until the end. */
async function* follow(
  pid: number,
  stream: ProcessStream,
  ctx: HandlerContext,
): AsyncGenerator<{ event: ProcessEvent }> {
  try {
    yield { event: toWire({ type: "start", pid }) };
    const every = keepaliveMs(ctx);
    for (;;) {
      const n = await stream.queue.next(every, ctx.signal);
      if (n === null) return;
      yield { event: "keepalive" in n ? keepalive() : toWire(n.event) };
    }
  } catch (e) {
    throw toConnectError(e);
  } finally {
    stream.detach();
  }
}

/** A process as envd's List shows it: a shell line is `/bin/sh -c LINE`; envs and cwd as given. */
function infoOf(c: RunningCommand) {
  const [cmd = "", ...args] = argvOf(c.cmd);
  return { pid: c.pid, tag: c.tag, config: { cmd, args, envs: c.env ?? {}, cwd: c.cwd } };
}

export function processService(st: EnvdState): ProcessImpl {
  const commandsOf = (ctx: HandlerContext): CommandTable => st.s.sandboxes.get(sandboxOf(ctx)).commands;
  /** The running command a selector names, and its sandbox's registry. */
  const find = (ctx: HandlerContext, sel: ProcessSelector | undefined) => {
    try {
      const commands = commandsOf(ctx);
      return { commands, c: commands.find(selectorOf(sel)) };
    } catch (e) {
      throw toConnectError(e);
    }
  };

  return {
    async *start(req, ctx) {
      let stream: ProcessStream;
      let started: Promise<{ pid: number }>;
      let pid = -1;
      // Released here on any failure until the command's end is wired to release it.
      let unwired: Lease | null = null;
      try {
        const cfg = checkStart(req);
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
        // Timed and its failure counted once, as every door's commands are (src/app/exec.ts).
        const run = new CommandRun(st.s, "envdStart");
        // No owner: its output goes to the streams attached (this one first: none is missed).
        const { handle, tap } = startCommand(lease, er, {
          spec: {
            door: "envd",
            env: cfg.envs,
            ...(cfg.cwd !== undefined ? { cwd } : {}),
            ...(req.tag !== undefined ? { tag: req.tag } : {}),
          },
          keepStdinOpen: er.stdin === true || size !== undefined,
        });
        stream = processStream(tap, () => pid, size !== undefined);
        started = handle.started.then((s) => ((pid = s.pid), s));
        handle.result
          .then(
            () => run.exited(),
            (e: unknown) => run.failed(e instanceof ForkdError ? e.code : "internal"),
          )
          .finally(() => lease.release())
          .catch(() => undefined);
        unwired = null;
      } catch (e) {
        unwired?.release();
        throw toConnectError(e);
      }
      // Detached however this generator ends (follow's own finally, a failed start, or a client
      // gone while the start was awaited).
      try {
        try {
          await started;
        } catch (e) {
          throw toConnectError(e);
        }
        yield* follow(pid, stream, ctx);
      } finally {
        stream.detach();
      }
    },

    async *connect(req, ctx) {
      const { c } = find(ctx, req.process);
      let stream: ProcessStream;
      try {
        stream = processStream(c.tap, () => c.pid, c.pty);
      } catch (e) {
        throw toConnectError(e);
      }
      yield* follow(c.pid, stream, ctx);
    },

    async list(_req, ctx) {
      try {
        return { processes: commandsOf(ctx).list().map(infoOf) };
      } catch (e) {
        throw toConnectError(e);
      }
    },

    async sendInput(req, ctx) {
      const { commands, c } = find(ctx, req.process);
      const input = req.input?.input;
      if (!input?.case) return {};
      try {
        commands.input(c, input.value, false);
      } catch (e) {
        throw toConnectError(e);
      }
      return {};
    },

    async streamInput(reqs, ctx) {
      let p: ReturnType<typeof find> | null = null;
      for await (const r of reqs) {
        if (r.event.case === "start") p = find(ctx, r.event.value.process);
        else if (r.event.case === "data") {
          if (!p) throw toConnectError(new ForkdError("invalid_argument", "data before the start event"));
          const input = r.event.value.input?.input;
          if (input?.case && p.c.stdinOpen) p.commands.input(p.c, input.value, false);
        }
      }
      return {};
    },

    async sendSignal(req, ctx) {
      const { commands, c } = find(ctx, req.process);
      if (req.signal !== Signal.SIGKILL && req.signal !== Signal.SIGTERM)
        throw toConnectError(new ForkdError("invalid_argument", "signal must be SIGKILL or SIGTERM"));
      commands.signal(c.pid, req.signal);
      return {};
    },

    async closeStdin(req, ctx) {
      const { commands, c } = find(ctx, req.process);
      if (c.pty)
        throw toConnectError(
          new ForkdError("invalid_argument", "a PTY has no stdin to close: send Ctrl-D (0x04) instead"),
        );
      if (c.stdinOpen) commands.input(c, new Uint8Array(0), true);
      return {};
    },

    async update(req, ctx) {
      const { commands, c } = find(ctx, req.process);
      const size = req.pty?.size;
      if (!size) return {};
      if (!c.pty) throw toConnectError(new ForkdError("invalid_argument", `process ${c.pid} has no PTY`));
      try {
        commands.resize(c.pid, size.rows, size.cols);
      } catch (e) {
        throw toConnectError(e);
      }
      return {};
    },
  };
}
