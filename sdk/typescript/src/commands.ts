/** `sandbox.commands`: run commands (waiting or in the background), list, signal, feed stdin. */
import { CommandExitError, CommandTimeoutError, ForkdError, errorFromEnvelope } from "./errors.js";
import type { CommandResult } from "./errors.js";
import type { Layout } from "./layout.js";
import type { Transport } from "./transport.js";
import type { CommandWire, ExecEventWire } from "./types.js";

export interface CommandStartOpts {
  /** Environment variables added to the guest's. */
  envs?: Record<string, string>;
  /** Working directory (default: the user's home; a relative one is under it). */
  cwd?: string;
  /**
   * The image's user to run as: name, uid, name:group or uid:gid ("root" always works).
   * Default: `user` when the image has that account (E2B's templates), else the image's default
   * user (root in forkd's templates).
   */
  user?: string;
  /** Kill the command's whole process group after this long (default 60 000 ms; 0 = never). */
  timeoutMs?: number;
  /** Called with output as it arrives (decoded as UTF-8, never split inside a character). */
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  /** A string is written to stdin, which is then closed; true keeps stdin open for sendStdin(). */
  stdin?: string | boolean;
  /** Return a CommandHandle as soon as the command started instead of waiting for it. */
  background?: boolean;
  /** @internal Run on a terminal of this size (sandbox.pty): output goes to onPty as bytes. */
  pty?: { rows: number; cols: number };
  /** @internal */
  onPty?: (data: Uint8Array) => void;
}

export interface ProcessInfo {
  pid: number;
  cmd: string;
  args: string[];
  startedAt: Date;
  stdinOpen: boolean;
  /** E2B's fields: the tag an E2B envd Start gave the command (others have none); env and cwd are not reported. */
  tag?: string;
  envs: Record<string, string>;
  cwd?: string;
}

/** One piece of output while iterating a handle (E2B's stdout/stderr/pty: one is set). */
export interface CommandOutput {
  stdout?: string;
  stderr?: string;
  pty?: Uint8Array;
}

const SIGNAL_NAMES: Record<number, string> = { 1: "SIGHUP", 2: "SIGINT", 9: "SIGKILL", 15: "SIGTERM" };

/** A command running in the background (or one being waited for). */
export class CommandHandle {
  private out = "";
  private err = "";
  private readonly outDec = new TextDecoder();
  private readonly errDec = new TextDecoder();
  private done: CommandResult | null = null;
  private detached = false;
  private readonly chunks = new EventQueue<CommandOutput>();
  /** Settles when the command exits (never rejects; see wait()). */
  private readonly finished: Promise<CommandResult | ForkdError>;

  /** @internal */
  constructor(
    readonly pid: number,
    private readonly commands: Commands,
    events: AsyncIterable<ExecEventWire>,
    private readonly opts: CommandStartOpts,
  ) {
    this.finished = this.#consume(events).then((r) => {
      this.chunks.end();
      return r;
    });
  }

  get stdout(): string {
    return this.out;
  }
  get stderr(): string {
    return this.err;
  }
  /** The exit code once it exited (-1 when a signal ended it), else undefined. */
  get exitCode(): number | undefined {
    return this.done?.exitCode;
  }

  /** The error of the command, when it did not exit normally (signal or timeout). */
  get error(): string | undefined {
    return this.done?.error;
  }

  #emit(which: "stdout" | "stderr", s: string): void {
    if (!s) return;
    if (which === "stdout") this.out += s;
    else this.err += s;
    if (!this.detached) (which === "stdout" ? this.opts.onStdout : this.opts.onStderr)?.(s);
    this.chunks.push(which === "stdout" ? { stdout: s } : { stderr: s });
  }

  async #consume(events: AsyncIterable<ExecEventWire>): Promise<CommandResult | ForkdError> {
    try {
      for await (const ev of events) {
        if (ev.type === "stdout" && this.opts.pty) {
          // a terminal's output: bytes, not stdout text
          const data = new Uint8Array(Buffer.from(ev.data, "base64"));
          if (data.length > 0) {
            if (!this.detached) this.opts.onPty?.(data);
            this.chunks.push({ pty: data });
          }
        } else if (ev.type === "stdout") {
          this.#emit("stdout", this.outDec.decode(Buffer.from(ev.data, "base64"), { stream: true }));
        } else if (ev.type === "stderr") {
          this.#emit("stderr", this.errDec.decode(Buffer.from(ev.data, "base64"), { stream: true }));
        } else if (ev.type === "exit") {
          this.#emit("stdout", this.outDec.decode());
          this.#emit("stderr", this.errDec.decode());
          this.done = {
            exitCode: ev.exit_code ?? -1,
            signal: ev.signal,
            timedOut: ev.timed_out,
            stdout: this.out,
            stderr: this.err,
            ...(ev.timed_out
              ? { error: "timed out" }
              : ev.signal !== null
                ? { error: `killed by ${SIGNAL_NAMES[ev.signal] ?? `signal ${ev.signal}`}` }
                : {}),
          };
          return this.done;
        } else if (ev.type === "error") {
          return errorFromEnvelope(200, ev.error.code, ev.error.message, ev.error.details);
        }
      }
      return new ForkdError("the command's output stream ended before it exited", { code: "connection" });
    } catch (e) {
      return e instanceof ForkdError ? e : new ForkdError(String(e), { code: "connection", cause: e });
    }
  }

  /**
   * Waits for the exit. Throws CommandExitError when the exit code is not 0, CommandTimeoutError
   * (a TimeoutError, as E2B's) when it ran past its timeout.
   */
  async wait(): Promise<CommandResult> {
    const r = await this.finished;
    if (r instanceof Error) throw r;
    if (r.timedOut) throw new CommandTimeoutError(r);
    if (r.exitCode !== 0) throw new CommandExitError(r);
    return r;
  }

  /** Output as it arrives; throws CommandTimeoutError at the end if it ran past its timeout. */
  async *[Symbol.asyncIterator](): AsyncIterator<CommandOutput> {
    for await (const c of this.chunks) yield c;
    const r = await this.finished;
    if (r instanceof Error) throw r;
    if (r.timedOut) throw new CommandTimeoutError(r);
  }

  /**
   * Stops calling this handle's callbacks; the command keeps running (its output is still read:
   * the daemon takes a hang-up for a request to kill it).
   */
  disconnect(): Promise<void> {
    this.detached = true;
    return Promise.resolve();
  }

  /** Kills the command's process group (SIGKILL). False if it had already exited. */
  async kill(): Promise<boolean> {
    if (this.done) return false;
    return this.commands.kill(this.pid);
  }

  async sendStdin(data: string | Uint8Array): Promise<void> {
    await this.commands.sendStdin(this.pid, data);
  }

  async closeStdin(): Promise<void> {
    await this.commands.closeStdin(this.pid);
  }
}

export class Commands {
  private readonly handles = new Map<number, CommandHandle>();

  /** @internal */
  constructor(
    private readonly t: Transport,
    private readonly id: string,
    private readonly layout: Layout | null = null,
    /** @internal The sandbox's own env (Sandbox.create({ envs })), under each command's. */
    readonly envs: Record<string, string> = {},
  ) {}

  #path(rest = ""): string {
    return `/v1/sandboxes/${this.id}${rest}`;
  }

  /** Runs `cmd` with /bin/sh -c and waits; throws CommandExitError when the exit code is not 0. */
  run(cmd: string | string[], opts?: CommandStartOpts & { background?: false }): Promise<CommandResult>;
  /** Starts `cmd` in the background and returns once it runs. */
  run(cmd: string | string[], opts: CommandStartOpts & { background: true }): Promise<CommandHandle>;
  async run(cmd: string | string[], opts: CommandStartOpts = {}): Promise<CommandResult | CommandHandle> {
    const handle = await this.#start(cmd, opts);
    if (!opts.background) return handle.wait();
    for (const [pid, h] of this.handles) if (h.exitCode !== undefined) this.handles.delete(pid);
    this.handles.set(handle.pid, handle);
    return handle;
  }

  async #start(cmd: string | string[], opts: CommandStartOpts): Promise<CommandHandle> {
    const timeoutMs = opts.timeoutMs ?? 60_000;
    const env = { ...this.envs, ...opts.envs };
    const user = opts.user ?? (await this.layout?.user());
    const cwd =
      opts.cwd !== undefined
        ? this.layout
          ? await this.layout.resolve(opts.cwd, user)
          : opts.cwd
        : await this.layout?.home(user);
    const body = {
      cmd,
      ...(Object.keys(env).length > 0 ? { env } : {}),
      ...(cwd ? { cwd } : {}),
      ...(user !== undefined ? { user } : {}),
      ...(timeoutMs > 0 ? { timeout_ms: timeoutMs } : {}),
      ...(typeof opts.stdin === "string" ? { stdin: opts.stdin } : {}),
      ...(opts.stdin === true && !opts.pty ? { keep_stdin_open: true } : {}),
      ...(opts.pty ? { pty: opts.pty } : {}),
    };
    return this.#open("POST", "/exec/stream", body, opts);
  }

  /** A handle on the NDJSON exec events of `path` (the first is "started", with the pid, or an error). */
  async #open(
    method: string,
    path: string,
    body: object | undefined,
    opts: CommandStartOpts,
  ): Promise<CommandHandle> {
    const queue = new EventQueue<ExecEventWire>();
    const stream = this.t
      .ndjson<ExecEventWire>(method, this.#path(path), (ev) => queue.push(ev), body ? { json: body } : {})
      .then(
        () => queue.end(),
        (e: unknown) => queue.fail(e),
      );
    void stream;
    const first = await queue.next();
    if (first === null) throw new ForkdError("the daemon closed the stream before the command started");
    if (first.type === "error") {
      // typed like any error reply (e.g. InvalidArgumentError for an unknown user); the stream was a 200
      throw errorFromEnvelope(200, first.error.code, first.error.message, first.error.details);
    }
    const pid = first.type === "started" ? first.pid : 0;
    if (first.type !== "started") queue.unshift(first);
    return new CommandHandle(pid, this, queue, opts);
  }

  /**
   * A handle on a running command started through the API (by this or any other client): its
   * output from now on and its exit (GET /v1/sandboxes/:id/commands/:pid/stream). Its
   * disconnect() or this process ending detaches only this handle; kill() kills the command.
   * A NotFoundError when no such command runs.
   */
  connect(pid: number, opts: Pick<CommandStartOpts, "onStdout" | "onStderr"> = {}): Promise<CommandHandle> {
    return this.#open("GET", `/commands/${pid}/stream`, undefined, opts);
  }

  /** Commands still running, whichever door started them (REST, a terminal, E2B's envd). */
  async list(): Promise<ProcessInfo[]> {
    const r = await this.t.json<{ commands: CommandWire[] }>("GET", this.#path("/commands"));
    return r.commands.map((c) => ({
      pid: c.pid,
      cmd: typeof c.cmd === "string" ? c.cmd : (c.cmd[0] ?? ""),
      args: typeof c.cmd === "string" ? [] : c.cmd.slice(1),
      startedAt: new Date(c.started),
      stdinOpen: c.stdin_open,
      ...(c.tag !== undefined ? { tag: c.tag } : {}),
      envs: {},
    }));
  }

  /** Sends SIGKILL (or `signal`) to a running command's process group. False if it is not running. */
  async kill(pid: number, signal: string | number = "SIGKILL"): Promise<boolean> {
    try {
      await this.t.json("POST", this.#path(`/commands/${pid}/signal`), { json: { signal } });
      return true;
    } catch (e) {
      if (e instanceof ForkdError && e.code === "not_found") return false;
      throw e;
    }
  }

  /** Writes to the stdin of a command started with `stdin: true`. */
  async sendStdin(pid: number, data: string | Uint8Array): Promise<void> {
    const body = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    await this.t.json("POST", this.#path(`/commands/${pid}/stdin`), { body });
  }

  async closeStdin(pid: number): Promise<void> {
    await this.t.json("POST", this.#path(`/commands/${pid}/stdin`), {
      body: new Uint8Array(0),
      query: { eof: 1 },
    });
  }
}

/** @internal A push/pull queue bridging the NDJSON callback to an async iterator. */
export class EventQueue<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private waiters: Array<{ resolve: (v: T | null) => void; reject: (e: Error) => void }> = [];
  private closed = false;
  private error: Error | null = null;

  push(v: T): void {
    const w = this.waiters.shift();
    if (w) w.resolve(v);
    else this.items.push(v);
  }
  unshift(v: T): void {
    this.items.unshift(v);
  }
  end(): void {
    this.closed = true;
    for (const w of this.waiters.splice(0)) w.resolve(null);
  }
  fail(e: unknown): void {
    this.error = e instanceof Error ? e : new Error(String(e));
    this.closed = true;
    for (const w of this.waiters.splice(0)) w.reject(this.error);
  }
  next(): Promise<T | null> {
    const v = this.items.shift();
    if (v !== undefined) return Promise.resolve(v);
    if (this.error) return Promise.reject(this.error);
    if (this.closed) return Promise.resolve(null);
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }
  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      const v = await this.next();
      if (v === null) return;
      yield v;
    }
  }
}
