/**
 * EXEC: a command in the guest, its output streams (paced by their consumers, flow.ts), its
 * stdin and signals, and the deadlines the host keeps on a guest that does not answer.
 */
import { ForkdError, errorMessage } from "../util/index.js";
import { PausableTimer } from "../util/index.js";
import { CHUNK, Msg, Tag, field, intField } from "./codec.js";
import type { FieldInput, Frame } from "./codec.js";
import type { AgentConnection } from "./connection.js";
import { WINDOW, isThenable } from "./flow.js";
import type { Consumed } from "./flow.js";
import { guestError } from "./guest-error.js";

export interface ExecRequest {
  /** argv, or a shell string run with /bin/sh -c. */
  argv?: string[];
  shell?: string;
  env?: Record<string, string>;
  cwd?: string;
  /** The user to run as (`name`, `uid`, `name:group`, `uid:gid`); absent: the image's default user. */
  user?: string;
  timeoutMs?: number;
  /** Keep stdin open for writeStdin(); otherwise it is /dev/null. */
  stdin?: boolean;
  /** How long the guest has to answer STARTED (default 30 s). */
  startTimeoutMs?: number;
  /**
   * Run on a pseudo-terminal of this size: stdin, stdout and stderr are its slave, all output
   * arrives on onStdout, stdin is always open (writeStdin), TERM defaults to xterm-256color.
   */
  pty?: PtySize;
  /**
   * The daemon's own helper command (a stat, a chown): run with exactly `env` over the guest's
   * base environment, never the sandbox-wide env (AgentClient.defaultEnv) its users set.
   */
  internal?: boolean;
}

export interface PtySize {
  rows: number;
  cols: number;
}

/** The largest PTY dimension the guest accepts (the kernel's winsize fields are 16-bit). */
export const PTY_MAX = 65535;

export interface ExecResult {
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
}

/**
 * Output handlers. A handler that returns a promise paces the stream: its bytes count as held
 * until the promise settles, and the guest stops sending once a window's worth is held.
 * A consumer's exception is its own: it does not break the connection.
 */
export interface ExecHandlers {
  onStdout?: (chunk: Buffer) => Consumed;
  onStderr?: (chunk: Buffer) => Consumed;
}

export interface ExecHandle {
  readonly started: Promise<{ pid: number }>;
  readonly result: Promise<ExecResult>;
  writeStdin(data: Uint8Array): void;
  closeStdin(): void;
  signal(sig: number): void;
  /** A PTY command's new terminal size (ignored for a command without a PTY). */
  resize(rows: number, cols: number): void;
}

/** A guest that has not answered EXEC with STARTED (or ERROR) by then is not going to. */
const STARTED_TIMEOUT_MS = 30_000;
/** Past an exec's own timeout, the guest has this long to report it. */
export const EXEC_GRACE_MS = 10_000;

/** Calls a consumer's handler; its exception is its own (the bytes count as consumed). */
function consume(fn: ((chunk: Buffer) => Consumed) | undefined, chunk: Buffer): Consumed {
  try {
    const r = fn?.(chunk);
    if (isThenable(r)) return Promise.resolve(r).catch(() => undefined);
    return undefined;
  } catch {
    return undefined;
  }
}

/** The guest's words for a `user` the image does not have (or a malformed one). */
const USER_ERROR_RE = /^(no user |no group |bad user |USER must)/;

/** A request's `user` that the image does not have is the caller's mistake. */
function userError(req: ExecRequest, e: ForkdError): ForkdError {
  if (req.user === undefined || !USER_ERROR_RE.test(e.message)) return e;
  return new ForkdError("invalid_argument", e.message, { ...e.details, field: "user", user: req.user });
}

/** The EXEC request's fields. */
function execFields(req: ExecRequest): FieldInput[] {
  const fields: FieldInput[] = [[Tag.WINDOW, WINDOW]];
  if (req.shell !== undefined) fields.push([Tag.SHELL, req.shell]);
  for (const a of req.argv ?? []) fields.push([Tag.ARG, a]);
  for (const [k, v] of Object.entries(req.env ?? {})) fields.push([Tag.ENV, `${k}=${v}`]);
  if (req.cwd !== undefined) fields.push([Tag.CWD, req.cwd]);
  if (req.user !== undefined) fields.push([Tag.USER, req.user]);
  if (req.timeoutMs !== undefined) fields.push([Tag.TIMEOUT_MS, req.timeoutMs]);
  if (req.stdin || req.pty) fields.push([Tag.STDIN, 1]);
  if (req.pty) fields.push([Tag.PTY_ROWS, req.pty.rows], [Tag.PTY_COLS, req.pty.cols]);
  return fields;
}

/**
 * Runs a command. Its output is paced by `handlers` (see ExecHandlers). Deadlines: STARTED
 * within STARTED_TIMEOUT_MS; with `timeoutMs`, EXIT within it plus EXEC_GRACE_MS, not counting
 * the time the consumer held a full window (the guest is then waiting on us).
 */
export function execCommand(
  conn: AgentConnection,
  req: ExecRequest,
  handlers: ExecHandlers = {},
): ExecHandle {
  if (req.pty) checkPtySize(req.pty.rows, req.pty.cols);
  return bindExec(conn, { req, fields: execFields(req), handlers: () => handlers });
}

/** A command an earlier host started, in flight in the guest when this connection began (handover.ts). */
export interface InheritedExecInfo {
  stream: number;
  pid: number;
  /** Its argv, or the shell string it runs (as the guest kept it: at most 2 KiB). */
  cmd: string[] | string;
  pty: boolean;
  stdinOpen: boolean;
  /** When it started (guest clock), if the guest said. */
  startedAt: Date | null;
  /** The guest paces it again with this connection's window. */
  paced: boolean;
}

export interface InheritedExec extends InheritedExecInfo {
  readonly handle: ExecHandle;
  /** Its output from now on goes to `handlers` (until then it is consumed and dropped). */
  attach(handlers: ExecHandlers): void;
}

/** Takes over an inherited command's stream: its output, stdin, signals and exit from now on. */
export function inheritExec(conn: AgentConnection, info: InheritedExecInfo): InheritedExec {
  let handlers: ExecHandlers = {};
  const handle = bindExec(conn, {
    req: info.pty ? { pty: { rows: 24, cols: 80 } } : {},
    inherited: info,
    handlers: () => handlers,
  });
  return {
    ...info,
    handle,
    attach: (h) => {
      handlers = h;
    },
  };
}

interface Binding {
  req: ExecRequest;
  /** A new command: the EXEC request's fields. */
  fields?: FieldInput[];
  /** Else a command already running on this stream. */
  inherited?: InheritedExecInfo;
  handlers: () => ExecHandlers;
}

/** An exec's stream: a new command's (EXEC sent), or an inherited one's (claimed). */
function bindExec(conn: AgentConnection, b: Binding): ExecHandle {
  const { req } = b;
  let resolveStarted!: (v: { pid: number }) => void;
  let rejectStarted!: (e: Error) => void;
  const started = new Promise<{ pid: number }>((res, rej) => {
    resolveStarted = res;
    rejectStarted = rej;
  });
  started.catch(() => undefined); // observed through `result` too
  let stream = b.inherited?.stream ?? 0;
  const result = new Promise<ExecResult>((resolve, reject) => {
    let backstop: PausableTimer | undefined;
    const flow = conn.flow(
      () => stream,
      (f) => (f.full ? backstop?.pause() : backstop?.resume()),
    );
    const finish = (err: ForkdError | null, r?: ExecResult) => {
      clearTimeout(startTimer);
      backstop?.clear();
      flow.end();
      conn.end(stream);
      if (err) {
        rejectStarted(err);
        reject(err);
      } else resolve(r!);
    };
    const giveUp = (msg: string) => {
      conn.abandon(stream);
      finish(new ForkdError("timeout", msg));
    };
    const startMs = req.startTimeoutMs ?? STARTED_TIMEOUT_MS;
    const startTimer = b.inherited
      ? undefined
      : setTimeout(() => giveUp(`guest did not start the command within ${startMs} ms`), startMs);
    // The guest enforces the command's timeout; ours is a backstop for a guest that never answers.
    if (req.timeoutMs !== undefined) {
      const ms = req.timeoutMs + EXEC_GRACE_MS;
      backstop = new PausableTimer(ms, () => giveUp(`guest did not finish exec within ${ms} ms`));
    }
    const output = (f: Frame, fn: ((chunk: Buffer) => Consumed) | undefined) => {
      const d = field(f.fields, Tag.DATA) ?? Buffer.alloc(0);
      flow.deliver(d.length, consume(fn, d));
    };
    const handler = (f: Frame | ForkdError) => {
      if (f instanceof ForkdError) return finish(f);
      switch (f.type) {
        case Msg.STARTED:
          if (b.inherited) return; // a STARTED the earlier host was sent
          clearTimeout(startTimer);
          if (intField(f.fields, Tag.WINDOW) !== undefined) flow.paced = true;
          if (req.pty && intField(f.fields, Tag.PTY_ROWS) === undefined) {
            // An agent older than PTYs ignored the size and runs the command on pipes.
            conn.abandon(stream);
            return finish(
              new ForkdError(
                "unavailable",
                "a command on a PTY needs a newer guest agent than this sandbox's: make its snapshot again",
                { feature: "pty" },
              ),
            );
          }
          return resolveStarted({ pid: intField(f.fields, Tag.PID) ?? -1 });
        case Msg.STDOUT:
          return output(f, b.handlers().onStdout);
        case Msg.STDERR:
          return output(f, b.handlers().onStderr);
        case Msg.EXIT: {
          const code = intField(f.fields, Tag.EXIT_CODE);
          const sig = intField(f.fields, Tag.EXIT_SIGNAL);
          return finish(null, {
            exitCode: code ?? null,
            signal: sig ?? null,
            timedOut: intField(f.fields, Tag.TIMED_OUT) === 1,
          });
        }
        case Msg.ERROR:
          return finish(userError(req, guestError(f.fields)));
      }
      throw new ForkdError("agent_protocol", `unexpected frame 0x${f.type.toString(16)} in exec`);
    };
    try {
      if (b.inherited) {
        flow.paced = b.inherited.paced;
        conn.claim(stream, handler, flow);
        resolveStarted({ pid: b.inherited.pid });
      } else {
        stream = conn.open(handler, flow);
        conn.send(Msg.EXEC, stream, b.fields ?? []);
      }
    } catch (e) {
      finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
    }
  });
  const sendOnStream = (type: number, fields: FieldInput[]) => {
    if (conn.isOpen(stream)) conn.send(type, stream, fields);
  };
  return {
    started,
    result,
    writeStdin: (data) => {
      for (let off = 0; off < data.length; off += CHUNK) {
        sendOnStream(Msg.STDIN, [[Tag.DATA, data.subarray(off, off + CHUNK)]]);
      }
    },
    closeStdin: () => sendOnStream(Msg.STDIN, []),
    signal: (sig) => sendOnStream(Msg.SIGNAL, [[Tag.SIGNAL, sig]]),
    resize: (rows, cols) => {
      if (!req.pty) return;
      checkPtySize(rows, cols);
      sendOnStream(Msg.RESIZE, [
        [Tag.PTY_ROWS, rows],
        [Tag.PTY_COLS, cols],
      ]);
    },
  };
}

/** Rows and columns are whole numbers from 1 to PTY_MAX. */
export function checkPtySize(rows: number, cols: number): void {
  for (const [name, v] of [
    ["rows", rows],
    ["cols", cols],
  ] as const) {
    if (!Number.isInteger(v) || v < 1 || v > PTY_MAX)
      throw new ForkdError("invalid_argument", `pty ${name} must be an integer from 1 to ${PTY_MAX}`, {
        field: `pty.${name}`,
      });
  }
}
