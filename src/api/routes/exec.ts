/**
 * exec (buffered and NDJSON-streaming, on pipes or a PTY), control of running commands (signal,
 * stdin, a PTY's size: the sandbox's command registry, src/sandbox/commands/, which every door
 * shares), and eval in a sandbox's warm interpreter.
 */
import { Hono } from "hono";
import type { z } from "zod";
import type { ExecHandle, ExecHandlers, ExecRequest } from "../../agent/index.js";
import { startCommand } from "../../sandbox/index.js";
import type { StartIn, StartedCommand } from "../../sandbox/index.js";
import { CommandRun } from "../../app/index.js";
import type { Services } from "../../app/index.js";
import type { ApiEnv } from "../env.js";
import {
  Eval,
  Exec,
  PidParam,
  PtySize,
  SendSignal,
  SIGNALS,
  StdinQuery,
  truthy,
} from "../contract/schemas.js";
import type { EvalEvent, EvalResult, ExecEvent, ExecResult } from "../contract/schemas.js";
import { parseBody, parseParams, parseQuery, readBytes } from "../parse.js";
import { commandView, endedCommandView } from "../views/command.js";
import { toEnvelope } from "../errors.js";
import { replyStream } from "../../http/index.js";

type ExecResultView = z.infer<typeof ExecResult>;
type ExecEventView = z.infer<typeof ExecEvent>;
type EvalResultView = z.infer<typeof EvalResult>;
type EvalEventView = z.infer<typeof EvalEvent>;

/** Buffered exec keeps at most this much of each output stream. */
const MAX_BUFFERED = 16 << 20;

function toRequest(b: z.infer<typeof Exec>): ExecRequest {
  return {
    ...(typeof b.cmd === "string" ? { shell: b.cmd } : { argv: b.cmd }),
    env: b.env,
    cwd: b.cwd,
    user: b.user,
    timeoutMs: b.timeout_ms,
    stdin: b.stdin !== undefined || b.keep_stdin_open,
    ...(b.pty ? { pty: b.pty } : {}),
  };
}

/**
 * Starts an exec request's command through the sandbox's registry (`door`: api or terminal) with
 * `owner` getting its output: its `stdin` written first, then closed unless it is to stay open
 * (keep_stdin_open, or a terminal whose request's stdin was not all of it).
 */
export function startExec(
  lease: StartIn,
  body: z.infer<typeof Exec>,
  owner: ExecHandlers,
  door: "api" | "terminal" = "api",
): StartedCommand {
  const req = toRequest(body);
  const keepStdinOpen = body.keep_stdin_open || (body.pty !== undefined && body.stdin === undefined);
  return startCommand(lease, req, {
    spec: {
      cmd: body.cmd,
      door,
      ...(body.env ? { env: body.env } : {}),
      ...(body.cwd !== undefined ? { cwd: body.cwd } : {}),
    },
    keepStdinOpen,
    ...(body.stdin !== undefined ? { stdin: Buffer.from(body.stdin, "utf8") } : {}),
    owner,
  });
}

/** A use() call's agent and commands as a start's lease (use() explains a failure itself). */
const within = (agent: StartIn["agent"], commands: StartIn["commands"]): StartIn => ({
  agent,
  commands,
  explain: async (e) => e,
});

class Capped {
  private chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  push(b: Buffer): void {
    if (this.size >= MAX_BUFFERED) {
      this.truncated = true;
      return;
    }
    const part = b.subarray(0, MAX_BUFFERED - this.size);
    if (part.length < b.length) this.truncated = true;
    this.chunks.push(Buffer.from(part));
    this.size += part.length;
  }
  text(): string {
    return Buffer.concat(this.chunks).toString("utf8");
  }
}

export function execRoutes(s: Services): Hono<ApiEnv> {
  const app = new Hono<ApiEnv>();

  app.post("/:id/exec", async (c) => {
    const body = await parseBody(c, Exec);
    const out = new Capped();
    const err = new Capped();
    const run = new CommandRun(s, "exec");
    const r = await s.sandboxes.use(c.req.param("id"), (agent, commands) => {
      const { handle } = startExec(within(agent, commands), body, {
        onStdout: (d) => out.push(d),
        onStderr: (d) => err.push(d),
      });
      return handle.result;
    });
    run.exited();
    const reply: ExecResultView = {
      exit_code: r.exitCode,
      signal: r.signal,
      timed_out: r.timedOut,
      stdout: out.text(),
      stderr: err.text(),
      stdout_truncated: out.truncated,
      stderr_truncated: err.truncated,
      duration_ms: Math.round(run.elapsedMs()),
    };
    return c.json(reply);
  });

  // One JSON object per line: started, stdout/stderr (base64: output is bytes), exit or error.
  app.post("/:id/exec/stream", async (c) => {
    const body = await parseBody(c, Exec);
    const lease = s.sandboxes.lease(c.req.param("id"));
    const stream = replyStream(
      (sink) => {
        // A client gone before the reply started never sees its command: none is started.
        if (sink.gone) return lease.release();
        const run = new CommandRun(s, "execStream");
        const send = (ev: ExecEventView): boolean => sink.line(ev);
        let handle: ExecHandle;
        // "started" (with the pid) is always the first line: output that arrives before the
        // started promise's callback has run (the guest's STARTED and first DATA in one read)
        // waits for it, in order.
        let early: ExecEventView[] | null = [];
        const output = (ev: ExecEventView): true | Promise<void> => {
          if (early) {
            early.push(ev);
            return true;
          }
          return send(ev) || sink.drained();
        };
        const flushEarly = (first: ExecEventView | null) => {
          const queued = early ?? [];
          early = null;
          if (first) send(first);
          for (const ev of queued) send(ev);
        };
        try {
          ({ handle } = startExec(lease, body, {
            // Paced by the client: while it reads slowly the output waits in the guest.
            onStdout: (d) => output({ type: "stdout", data: d.toString("base64") }),
            onStderr: (d) => output({ type: "stderr", data: d.toString("base64") }),
          }));
        } catch (e) {
          lease.release();
          throw e; // before the reply started: an error reply with its status
        }
        // The client went away: do not leave its command running, nor the sandbox held by it.
        sink.onHangup(() => {
          lease.release();
          handle.signal(9);
        });
        handle.started.then(
          (p) => flushEarly({ type: "started", pid: p.pid }),
          () => flushEarly(null),
        );
        handle.result
          .then(
            (r) => {
              flushEarly(null);
              run.exited();
              send({
                type: "exit",
                exit_code: r.exitCode,
                signal: r.signal,
                timed_out: r.timedOut,
                duration_ms: Math.round(run.elapsedMs()),
              });
            },
            (e: unknown) => {
              flushEarly(null);
              const { body: env } = toEnvelope(e);
              run.failed(env.error.code);
              send({ type: "error", ...env });
            },
          )
          .finally(() => {
            lease.release();
            sink.end();
          })
          .catch((e: unknown) => s.log.warn("exec stream: reply not sent", { error: String(e) }));
      },
      { outgoing: c.env?.outgoing },
    );
    return new Response(stream, { status: 200, headers: { "content-type": "application/x-ndjson" } });
  });

  app.get("/:id/commands/history", (c) =>
    c.json({ commands: s.sandboxes.get(c.req.param("id")).commands.history().map(endedCommandView) }),
  );

  app.get("/:id/commands", (c) =>
    c.json({ commands: s.sandboxes.get(c.req.param("id")).commands.list().map(commandView) }),
  );

  // Another client's view of a running command: its output from now on, then its exit.
  app.get("/:id/commands/:pid/stream", (c) => {
    const { id, pid } = parseParams(c, PidParam);
    const table = s.sandboxes.get(id).commands;
    const running = table.get(pid); // a 404 before the reply starts
    running.tap.admit(); // and a 429 past the readers' bound
    const started = Date.parse(running.started);
    const stream = replyStream(
      (sink) => {
        if (sink.gone) return;
        const send = (ev: ExecEventView): boolean => sink.line(ev);
        send({ type: "started", pid });
        let detach: () => void = () => undefined;
        try {
          detach = table.attach(pid, {
            output: (stream, d) => send({ type: stream, data: d.toString("base64") }),
            drained: () => sink.drained(),
            exit: (r) => {
              send({
                type: "exit",
                exit_code: r.exitCode,
                signal: r.signal,
                timed_out: r.timedOut,
                duration_ms: Date.now() - started,
              });
              sink.end();
            },
            error: (e) => {
              send({ type: "error", ...toEnvelope(e).body });
              sink.end();
            },
            cut: () => sink.fail(new Error("the reader fell too far behind the command's output")),
          });
        } catch (e) {
          // it exited between the check and the reply's start
          send({ type: "error", ...toEnvelope(e).body });
          return sink.end();
        }
        sink.onHangup(detach);
      },
      { outgoing: c.env?.outgoing },
    );
    return new Response(stream, { status: 200, headers: { "content-type": "application/x-ndjson" } });
  });

  app.post("/:id/commands/:pid/signal", async (c) => {
    const { id, pid } = parseParams(c, PidParam);
    const { signal } = await parseBody(c, SendSignal);
    const cmd = await s.sandboxes.use(id, async (_agent, commands) =>
      commands.signal(pid, typeof signal === "number" ? signal : SIGNALS[signal]),
    );
    return c.json(commandView(cmd));
  });

  app.post("/:id/commands/:pid/stdin", async (c) => {
    const { id, pid } = parseParams(c, PidParam);
    const q = parseQuery(c, StdinQuery);
    const data = await readBytes(c);
    const cmd = await s.sandboxes.use(id, async (_agent, commands) =>
      commands.writeStdin(pid, data, truthy(q.eof)),
    );
    return c.json(commandView(cmd));
  });

  app.post("/:id/commands/:pid/resize", async (c) => {
    const { id, pid } = parseParams(c, PidParam);
    const { rows, cols } = await parseBody(c, PtySize);
    const cmd = await s.sandboxes.use(id, async (_agent, commands) => commands.resize(pid, rows, cols));
    return c.json(commandView(cmd));
  });

  app.post("/:id/eval", async (c) => {
    const body = await parseBody(c, Eval);
    const id = c.req.param("id");
    const env = body.env;
    const reply: EvalResultView = await s.sandboxes.use(id, (agent) =>
      agent.eval(body.code, body.timeout_ms, body.language, {
        ...(body.context_id ? { context: body.context_id } : {}),
        ...(env ? { env } : {}),
      }),
    );
    return c.json(reply);
  });

  // One JSON object per line: stdout/stderr text while the cell runs, then result or error.
  app.post("/:id/eval/stream", async (c) => {
    const body = await parseBody(c, Eval);
    const id = c.req.param("id");
    const env = body.env;
    const lease = s.sandboxes.lease(id);
    const stream = replyStream(
      (sink) => {
        if (sink.gone) return lease.release();
        const ac = new AbortController();
        // The client went away: its cell is interrupted (the kernel keeps its state).
        sink.onHangup(() => ac.abort());
        const send = (ev: EvalEventView): boolean => sink.line(ev);
        lease.agent
          .eval(body.code, body.timeout_ms, body.language, {
            ...(body.context_id ? { context: body.context_id } : {}),
            ...(env ? { env } : {}),
            onOutput: (stream, text) => void send({ type: stream, text }),
            signal: ac.signal,
          })
          .then(
            (r) => send({ type: "result", result: r }),
            async (e: unknown) => {
              const { body: envl } = toEnvelope(await lease.explain(e));
              s.metrics.failure("evalStream", envl.error.code);
              send({ type: "error", ...envl });
            },
          )
          .finally(() => {
            lease.release();
            sink.end();
          })
          .catch((e: unknown) => s.log.warn("eval stream: reply not sent", { error: String(e) }));
      },
      { outgoing: c.env?.outgoing },
    );
    return new Response(stream, { status: 200, headers: { "content-type": "application/x-ndjson" } });
  });

  return app;
}
