/**
 * Host side of the guest agent protocol (docs/agent-protocol.md), the one object the rest of the
 * daemon holds per VM. It composes the parts, laid out like the guest's own (guest/agent/src):
 *
 *   connection.ts  the socket, framing, streams in flight, deadlines, pause, reconnect/resync
 *   exec.ts        EXEC: commands, their output, stdin and signals
 *   files.ts       READ/WRITE/STAT/LIST/MKDIR/REMOVE/RENAME/SYNC
 *   eval.ts        EVAL: cells of the warm kernels (python, javascript)
 *   watch.ts       WATCH: a directory's changes (inotify), streamed
 *   eval-contexts.ts  code contexts of those kernels
 *   identity.ts    IDENTITY and PING
 *   handover.ts    STREAMS: what an earlier host left in flight in the guest
 *
 * A connection to a VM's guest begins with a handover (handover.ts): the guest's stream table
 * may hold an earlier host's streams (a resume, a daemon restart, a child of a branch), so
 * nothing is sent until this connection numbers its streams past them; the commands found are
 * kept for inherited() (the sandbox service takes them over). (A client made without
 * `handover`, a test's scripted guest, sends its requests at once.)
 *
 * An agent older than exec users and kernels ignores USER and LANGUAGE (unknown fields): before
 * the first request that needs them the client asks the agent (PING, once) and refuses with
 * `unavailable` instead of running the command as root or the cell in Python. The same for a
 * file request as a user: only to an agent whose PING lists the feature `file-user` (an older
 * one would act as root); callers ask fileUsers() to choose another way for such an agent.
 *
 * Events (from the connection): "close" (the error that ended it), "broken" (it gave up on a
 * guest that corrupts its channel, with the reason), "resynced" (made again after garbage).
 */
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import { dialUnix } from "../util/index.js";
import { AgentConnection } from "./connection.js";
import { ForkdError } from "../util/index.js";
import { evalCode } from "./eval.js";
import type { EvalLanguage, EvalOptions, EvalResult } from "./eval.js";
import { contextOp } from "./eval-contexts.js";
import type { CodeContext, ContextOp } from "./eval-contexts.js";
import { checkPtySize, execCommand } from "./exec.js";
import { gatedExec } from "./exec-gate.js";
import type { ExecHandle, ExecHandlers, ExecRequest } from "./exec.js";
import * as files from "./files.js";
import type { DirEntry, FileStat } from "./files.js";
import type { Consumed } from "./flow.js";
import { handover } from "./handover.js";
import type { InheritedExec } from "./exec.js";
import { identity, ping } from "./identity.js";
import type { Identity, PingResult } from "./identity.js";
import { gatedWatch, watchDir } from "./watch.js";
import type { WatchEvent, WatchHandle, WatchOptions } from "./watch.js";

export type { Consumed } from "./flow.js";
export type { EvalLanguage, EvalOptions, EvalResult, MimeBundle } from "./eval.js";
export type { CodeContext, ContextOp } from "./eval-contexts.js";
export { EVAL_LANGUAGES, parseEvalJson } from "./eval.js";
export type {
  ExecHandle,
  ExecHandlers,
  ExecRequest,
  ExecResult,
  InheritedExec,
  InheritedExecInfo,
  PtySize,
} from "./exec.js";
export { EXEC_GRACE_MS, PTY_MAX, checkPtySize } from "./exec.js";
export type { DirEntry, FileStat } from "./files.js";
export { guestError } from "./guest-error.js";
export type { Identity, PingResult } from "./identity.js";
export type { WatchEvent, WatchEventType, WatchHandle, WatchOptions } from "./watch.js";
export { WATCH_EVENT_TYPES } from "./watch.js";

const EVENTS = ["close", "broken", "resynced"] as const;

/** How long the handover may take when the first request says nothing shorter. */
const HANDOVER_MS = 30_000;

export class AgentClient extends EventEmitter {
  /** The agent's PING, asked once (what it supports); cleared if it failed. */
  private features: Promise<PingResult> | null = null;
  /** The handover (handover.ts), asked before the first request; cleared if it failed. */
  private hello: Promise<InheritedExec[]> | null = null;
  /** The inherited commands are handed out once (inherited()). */
  private inheritedTaken = false;
  /**
   * The sandbox-wide environment (its record's `env`): every exec and cell sees it under the
   * request's own env, which wins on a clash. Set by the sandbox service whenever it hands out the client.
   */
  defaultEnv: Record<string, string> = {};

  private constructor(
    readonly socketPath: string,
    private readonly conn: AgentConnection,
    private readonly handsOver: boolean,
  ) {
    super();
    for (const name of EVENTS) conn.on(name, (...args: unknown[]) => this.emit(name, ...args));
  }

  /**
   * Connects to the agent's socket, retrying while it does not exist yet (QEMU still starting).
   */
  static async connect(
    socketPath: string,
    timeoutMs = 10_000,
    signal?: AbortSignal,
    opts: { handover?: boolean } = {},
  ): Promise<AgentClient> {
    const socket = await dialUnix(socketPath, timeoutMs, "agent", signal);
    return new AgentClient(
      socketPath,
      new AgentConnection(socket, () => dialUnix(socketPath, 5_000, "agent")),
      opts.handover === true,
    );
  }

  /**
   * Wraps an already connected stream (tests: one end of a socketpair to an agent process).
   * Without `redial`, garbage from the guest closes the client for good.
   */
  static fromSocket(
    socket: Socket,
    label = "socket",
    redial?: () => Promise<Socket>,
    opts: { handover?: boolean } = {},
  ): AgentClient {
    return new AgentClient(label, new AgentConnection(socket, redial ?? null), opts.handover === true);
  }

  get closed(): boolean {
    return this.conn.closed;
  }

  close(): void {
    this.conn.close();
  }

  /** Resolves once the handover is done (asked now if it was not: `timeoutMs` bounds it). */
  private ready(timeoutMs = HANDOVER_MS): Promise<InheritedExec[]> {
    if (!this.hello) {
      const p = this.handsOver ? handover(this.conn, Math.max(timeoutMs, 1_000)) : Promise.resolve([]);
      this.hello = p;
      p.catch(() => {
        if (this.hello === p) this.hello = null;
      });
    }
    return this.hello;
  }

  /** `fn` once the handover is done. */
  private async gated<T>(timeoutMs: number | undefined, fn: () => Promise<T>): Promise<T> {
    await this.ready(timeoutMs);
    return fn();
  }

  /**
   * The commands an earlier host left running in the guest (handover.ts), taken over by this
   * connection: handed out once (later calls get none), for the sandbox service to track.
   */
  async inherited(timeoutMs?: number): Promise<InheritedExec[]> {
    const all = await this.ready(timeoutMs);
    if (this.inheritedTaken) return [];
    this.inheritedTaken = true;
    return all;
  }

  ping(timeoutMs?: number): Promise<PingResult> {
    return this.gated(timeoutMs, () => ping(this.conn, timeoutMs));
  }

  /** Gives a forked child its own identity: fresh kernel RNG, correct clock, hostname, id. */
  identity(id: Identity, timeoutMs?: number): Promise<void> {
    return this.gated(timeoutMs, () => identity(this.conn, id, timeoutMs));
  }

  sync(timeoutMs?: number): Promise<void> {
    return this.gated(timeoutMs, () => files.sync(this.conn, timeoutMs));
  }

  /** Runs a command; its output is paced by `handlers` (exec.ts). */
  exec(request: ExecRequest, handlers?: ExecHandlers): ExecHandle {
    const req =
      request.internal === true || Object.keys(this.defaultEnv).length === 0
        ? request
        : { ...request, env: { ...this.defaultEnv, ...request.env } };
    if (req.pty) checkPtySize(req.pty.rows, req.pty.cols); // refused at once, not once started
    const gate =
      req.user === undefined
        ? this.ready(req.startTimeoutMs).then(() => undefined)
        : this.requireKernels("exec as a user", req.startTimeoutMs);
    return gatedExec(gate, () => execCommand(this.conn, req, handlers));
  }

  /** The agent's PING, asked once after the handover (what it supports); asked again if it failed. */
  private async pingOnce(timeoutMs?: number): Promise<PingResult> {
    await this.ready(timeoutMs);
    if (!this.features) {
      const p = ping(this.conn, 10_000);
      this.features = p;
      p.catch(() => {
        if (this.features === p) this.features = null;
      });
    }
    return this.features;
  }

  /** Refuses what an agent older than users and kernels would ignore (it reports no KERNELS). */
  private async requireKernels(what: string, timeoutMs?: number): Promise<void> {
    if ((await this.pingOnce(timeoutMs)).kernels === null) throw tooOld(what);
  }

  /** Whether the agent acts as a named user on file requests (FEATURES file-user). */
  async fileUsers(timeoutMs?: number): Promise<boolean> {
    return (await this.pingOnce(timeoutMs)).features.includes("file-user");
  }

  /**
   * Waits for the handover, then refuses a file request as `user` to an agent that would act as
   * root instead.
   */
  private async fileGate(user: string | undefined, what: string, timeoutMs?: number): Promise<void> {
    await this.ready(timeoutMs);
    if (user !== undefined && !(await this.fileUsers(timeoutMs))) throw tooOld(`${what} as a user`);
  }

  /**
   * Reads a whole file, refusing one larger than `maxBytes` (the guest decides the size); as
   * `user` (its permissions) where given, else as the agent (root).
   */
  async readFile(
    path: string,
    opts?: { maxBytes?: number; timeoutMs?: number; user?: string },
  ): Promise<Buffer> {
    await this.fileGate(opts?.user, "reading a file", opts?.timeoutMs);
    return files.readFile(this.conn, path, opts);
  }

  /** Streams a file's bytes to `onChunk`, which paces the read (files.ts); resolves with its size. */
  async readFileStream(
    path: string,
    onChunk: (chunk: Buffer) => Consumed,
    timeoutMs?: number,
    user?: string,
  ): Promise<number> {
    await this.fileGate(user, "reading a file", timeoutMs);
    return files.readFileStream(this.conn, path, onChunk, timeoutMs, user);
  }

  /** Writes a file atomically in the guest (temp file, fsync, rename); as `user`, it is theirs. */
  async writeFile(
    path: string,
    data: Uint8Array | AsyncIterable<Uint8Array>,
    opts?: { mode?: number; makeParents?: boolean; timeoutMs?: number; user?: string },
  ): Promise<number> {
    await this.fileGate(opts?.user, "writing a file", opts?.timeoutMs);
    return files.writeFile(this.conn, path, data, opts);
  }

  /**
   * Resolves once the connection takes more writes (at once when it does): a writer fed from
   * outside (a terminal's keystrokes) waits on it instead of queueing without bound.
   */
  drain(): Promise<void> {
    return this.conn.drain();
  }

  async stat(path: string, timeoutMs?: number, user?: string): Promise<FileStat> {
    await this.fileGate(user, "stat", timeoutMs);
    return files.stat(this.conn, path, timeoutMs, user);
  }

  async list(path: string, timeoutMs?: number, user?: string): Promise<DirEntry[]> {
    await this.fileGate(user, "listing a directory", timeoutMs);
    return files.list(this.conn, path, timeoutMs, user);
  }

  async mkdir(
    path: string,
    opts?: { parents?: boolean; mode?: number; user?: string },
    timeoutMs?: number,
  ): Promise<void> {
    await this.fileGate(opts?.user, "making a directory", timeoutMs);
    return files.mkdir(this.conn, path, opts, timeoutMs);
  }

  async remove(
    path: string,
    opts?: { recursive?: boolean; user?: string },
    timeoutMs?: number,
  ): Promise<void> {
    await this.fileGate(opts?.user, "removing a file", timeoutMs);
    return files.remove(this.conn, path, opts, timeoutMs);
  }

  async rename(from: string, to: string, timeoutMs?: number, user?: string): Promise<void> {
    await this.fileGate(user, "moving a file", timeoutMs);
    return files.rename(this.conn, from, to, timeoutMs, user);
  }

  /**
   * Watches a directory (`recursive`: its subdirectories too, also those made later); events
   * are paced by `onEvent` like exec output (a promise holds them). See watch.ts. It starts once
   * the handover is done; with `opts.user`, only on an agent with file users (else `ready`
   * rejects with `unavailable`).
   */
  watch(path: string, opts: WatchOptions, onEvent: (e: WatchEvent) => Consumed): WatchHandle {
    return gatedWatch(this.fileGate(opts.user, "watching a directory", opts.readyTimeoutMs), () =>
      watchDir(this.conn, path, opts, onEvent),
    );
  }

  /** Runs a cell in the kernel of `language` (default python), in a context, with env vars. */
  async eval(
    code: string,
    timeoutMs?: number,
    language: EvalLanguage = "python",
    opts: EvalOptions = {},
  ): Promise<EvalResult> {
    if (language !== "python") await this.requireKernels(`eval in ${language}`, timeoutMs);
    else await this.ready(timeoutMs);
    const env = { ...this.defaultEnv, ...opts.env };
    return evalCode(this.conn, code, timeoutMs, language, {
      ...opts,
      env: Object.keys(env).length > 0 ? env : undefined,
    });
  }

  /** Creates, lists, deletes or restarts code contexts of the kernel of `language`. */
  async contexts(language: EvalLanguage, op: ContextOp): Promise<CodeContext[]> {
    await this.requireKernels("code contexts");
    return contextOp(this.conn, language, op);
  }
}

const tooOld = (what: string): ForkdError =>
  new ForkdError(
    "unavailable",
    `${what} needs a newer guest agent than this sandbox's: make its snapshot again`,
    {
      feature: what,
    },
  );
