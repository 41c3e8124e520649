/**
 * Host side of the guest agent protocol over a VM's virtio-serial unix socket.
 * One connection multiplexes many concurrent streams; every request has a deadline. Output
 * streams are paced by their consumers (flow.ts). Anything malformed from the guest fails the
 * requests in flight and the connection is made again and resynchronised (a few times a
 * minute at most; past that the client gives up and emits "broken" with the reason).
 */
import { randomBytes } from "node:crypto";
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import { ForkdError, errorMessage } from "../util/errors.js";
import { dialUnix } from "../util/net.js";
import { PausableTimer } from "../util/pausable-timer.js";
import { sleep } from "../util/time.js";
import { CHUNK, FrameDecoder, Msg, Tag, encodeFrame, field, intField, strField } from "./codec.js";
import type { Field, FieldInput, Frame } from "./codec.js";
import { errnoCode, errnoName } from "./errno.js";
import { StreamFlow, WINDOW, isThenable } from "./flow.js";
import type { Consumed } from "./flow.js";

export type { Consumed } from "./flow.js";

export interface ExecRequest {
  /** argv, or a shell string run with /bin/sh -c. */
  argv?: string[];
  shell?: string;
  env?: Record<string, string>;
  cwd?: string;
  timeoutMs?: number;
  /** Keep stdin open for writeStdin(); otherwise it is /dev/null. */
  stdin?: boolean;
  /** How long the guest has to answer STARTED (default 30 s). */
  startTimeoutMs?: number;
}

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
}

export interface FileStat {
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  mode: number;
  mtimeMs: number;
}

export interface DirEntry extends FileStat {
  name: string;
}

/** One rich output: MIME type to data (text, or base64 for images; JSON for application/json). */
export type MimeBundle = Record<string, unknown>;

export interface EvalResult {
  ok: boolean;
  value: string | null;
  /** Rich forms of the value (text/html, image/png, ...), if it has any. */
  value_data: MimeBundle | null;
  /** display()ed objects and figures the cell left open, in order. */
  display: MimeBundle[];
  stdout: string;
  stderr: string;
  error: { name: string; value: string; traceback: string } | null;
}

export interface PingResult {
  version: number;
  uptimeMs: number;
  evalReady: boolean;
}

export interface Identity {
  hostname: string;
  sandboxId: string;
  /** Processes the guest workload may have (its cgroup's pids.max); absent: the guest default. */
  pidsMax?: number;
  /** The host set the NIC's link up: reply only once the guest has carrier (wait at most this long, ms). */
  netUpWaitMs?: number;
}

/** A stream's handler: a frame for it, or the error that ended the connection under it. */
type StreamHandler = (frame: Frame | ForkdError) => void;

const FILE_TYPES = { 1: "file", 2: "dir", 3: "symlink", 4: "other" } as const;
const DEFAULT_TIMEOUT_MS = 30_000;
const MAX_STREAMS = 1024;
/** A guest that has not answered EXEC with STARTED (or ERROR) by then is not going to. */
const STARTED_TIMEOUT_MS = 30_000;
/** Past an exec's own timeout, the guest has this long to report it. */
export const EXEC_GRACE_MS = 10_000;
/** An unpaced stream (an old agent) holding more than this pauses the whole connection. */
const HOLD_CAP = 4 * WINDOW;
/** Reconnections after garbage from the guest allowed within RESYNC_WINDOW_MS. */
const RESYNC_MAX = 3;
const RESYNC_WINDOW_MS = 60_000;
/** Before dialling again: lets the agent see the host end close and drop its partial frames. */
const RESYNC_DELAY_MS = 250;
const RESYNC_PING_MS = 5_000;
/** Frames queued while reconnecting before writers are asked to wait (send() returns false). */
const PENDING_SOFT_MAX = 1 << 20;

export function guestError(fields: Field[]): ForkdError {
  const errno = intField(fields, Tag.ERRNO) ?? 0;
  const message = strField(fields, Tag.MESSAGE) ?? "guest error";
  return new ForkdError(errnoCode(errno), message, { errno, errno_name: errnoName(errno) });
}

const asProtocolError = (e: unknown): ForkdError =>
  e instanceof ForkdError ? e : new ForkdError("agent_protocol", errorMessage(e));

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

export class AgentClient extends EventEmitter {
  private socket: Socket | null = null;
  private decoder = new FrameDecoder();
  private readonly streams = new Map<number, StreamHandler>();
  private readonly flows = new Map<number, StreamFlow>();
  private nextStream = 1;
  private closedError: ForkdError | null = null;
  /** Frames sent while reconnecting; written once the channel answers again. */
  private pending: Buffer[] | null = null;
  private pendingBytes = 0;
  /** While reconnecting: fails the resynchronising PING (garbage again, or closed). */
  private probeFail: ((e: ForkdError) => void) | null = null;
  private readonly resyncs: number[] = [];
  private paused = false;

  private constructor(
    readonly socketPath: string,
    private readonly redial: (() => Promise<Socket>) | null,
  ) {
    super();
  }

  /**
   * Connects to the agent's socket, retrying while it does not exist yet (QEMU still starting).
   */
  static async connect(socketPath: string, timeoutMs = 10_000, signal?: AbortSignal): Promise<AgentClient> {
    const client = new AgentClient(socketPath, () => dialUnix(socketPath, 5_000, "agent"));
    client.attach(await dialUnix(socketPath, timeoutMs, "agent", signal));
    return client;
  }

  /**
   * Wraps an already connected stream (tests: one end of a socketpair to an agent process).
   * Without `redial`, garbage from the guest closes the client for good.
   */
  static fromSocket(socket: Socket, label = "socket", redial?: () => Promise<Socket>): AgentClient {
    const client = new AgentClient(label, redial ?? null);
    client.attach(socket);
    return client;
  }

  get closed(): boolean {
    return this.closedError !== null;
  }

  private attach(s: Socket): void {
    this.socket = s;
    this.decoder = new FrameDecoder();
    s.setNoDelay?.(true);
    if (this.paused) s.pause();
    s.on("data", (chunk: Buffer) => {
      if (this.socket === s) this.onData(chunk);
    });
    s.on("error", (e) => {
      if (this.socket === s) this.fail(new ForkdError("unavailable", `agent connection: ${e.message}`));
    });
    s.on("close", () => {
      if (this.socket === s) this.fail(new ForkdError("unavailable", "agent connection closed"));
    });
  }

  private onData(chunk: Buffer): void {
    let frames: Frame[];
    try {
      frames = this.decoder.push(chunk);
    } catch (e) {
      this.corrupted(asProtocolError(e));
      return;
    }
    const s = this.socket;
    for (const f of frames) {
      const h = this.streams.get(f.stream);
      if (h) {
        try {
          h(f);
        } catch (e) {
          this.corrupted(asProtocolError(e));
          return;
        }
        if (this.socket !== s) return; // a handler's frame was nonsense: reconnected
      }
      // Frames for unknown streams (late output after a timeout) are dropped.
    }
  }

  /** Detaches and closes the current socket without that counting as the connection's end. */
  private dropSocket(): void {
    const s = this.socket;
    this.socket = null;
    s?.destroy();
  }

  /**
   * The guest sent something that is not the protocol: the byte stream cannot be trusted from
   * here on. Fail what is in flight, connect again (the agent drops partial frames when the host
   * end closes) and check the channel with a PING, at most RESYNC_MAX times a minute.
   */
  private corrupted(err: ForkdError): void {
    if (this.closedError) return;
    if (this.probeFail) {
      this.probeFail(err);
      return;
    }
    const now = Date.now();
    while (this.resyncs.length > 0 && this.resyncs[0]! < now - RESYNC_WINDOW_MS) this.resyncs.shift();
    if (!this.redial || this.resyncs.length >= RESYNC_MAX) {
      this.giveUp(err);
      return;
    }
    this.resyncs.push(now);
    this.dropSocket();
    this.pending = [];
    this.pendingBytes = 0;
    this.setPaused(false);
    const abandoned = [...this.streams.keys()];
    this.failStreams(
      new ForkdError("agent_protocol", `the guest corrupted its agent channel (${err.message}); reconnected`),
    );
    void this.resync(abandoned);
  }

  /** Corrupted too often (or cannot reconnect): closed for good, and the owner is told why. */
  private giveUp(err: ForkdError): void {
    const n = this.resyncs.length + 1;
    const reason = this.redial
      ? `the guest corrupted its agent channel ${n} times within ${RESYNC_WINDOW_MS / 1000} s (${err.message})`
      : `the guest corrupted its agent channel (${err.message})`;
    this.fail(new ForkdError("agent_protocol", reason));
    this.emit("broken", reason);
  }

  private async resync(abandoned: number[]): Promise<void> {
    for (;;) {
      let error: ForkdError;
      try {
        await sleep(RESYNC_DELAY_MS);
        if (this.closedError) return;
        const s = await this.redial!();
        if (this.closedError) {
          s.destroy();
          return;
        }
        this.attach(s);
        await this.probe();
        break;
      } catch (e) {
        if (this.closedError) return;
        error = e instanceof ForkdError ? e : new ForkdError("unavailable", errorMessage(e));
      }
      this.dropSocket();
      if (error.code === "unavailable") {
        // Its socket is gone: the VMM is (the sandbox service hears of that from the VMM).
        this.fail(new ForkdError("unavailable", `agent reconnection: ${error.message}`));
        return;
      }
      const now = Date.now();
      while (this.resyncs.length > 0 && this.resyncs[0]! < now - RESYNC_WINDOW_MS) this.resyncs.shift();
      if (this.resyncs.length >= RESYNC_MAX) {
        this.giveUp(error);
        return;
      }
      this.resyncs.push(now);
    }
    const queued = this.pending ?? [];
    this.pending = null;
    this.pendingBytes = 0;
    // What failed under the garbage may still run in the guest: stop it.
    for (const id of abandoned) this.socket?.write(encodeFrame(Msg.CANCEL, id));
    for (const b of queued) this.socket?.write(b);
    this.emit("resynced");
  }

  /** A PING on the new connection, written ahead of what is queued. */
  private probe(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let stream = 0;
      const done = (e: ForkdError | null) => {
        clearTimeout(timer);
        this.probeFail = null;
        this.streams.delete(stream);
        if (e) reject(e);
        else resolve();
      };
      const timer = setTimeout(
        () => done(new ForkdError("timeout", `agent did not answer PING within ${RESYNC_PING_MS} ms`)),
        RESYNC_PING_MS,
      );
      this.probeFail = done;
      stream = this.openStream((f) => {
        if (f instanceof ForkdError) return done(f);
        if (f.type === Msg.OK) return done(null);
        done(new ForkdError("agent_protocol", `unexpected frame 0x${f.type.toString(16)} for PING`));
      });
      this.socket!.write(encodeFrame(Msg.PING, stream));
    });
  }

  private failStreams(err: ForkdError): void {
    const handlers = [...this.streams.values()];
    this.streams.clear();
    this.flows.clear();
    for (const h of handlers) {
      try {
        h(err);
      } catch {
        /* handlers reject their own promises */
      }
    }
  }

  /** Breaks the connection for good: every pending request fails with `err`. Idempotent. */
  private fail(err: ForkdError): void {
    if (this.closedError) return;
    this.closedError = err;
    this.dropSocket();
    this.pending = null;
    this.probeFail?.(err);
    this.failStreams(err);
    this.emit("close", err);
  }

  close(): void {
    this.fail(new ForkdError("unavailable", "agent connection closed by host"));
  }

  private openStream(handler: StreamHandler): number {
    if (this.closedError) throw this.closedError;
    if (this.streams.size >= MAX_STREAMS)
      throw new ForkdError("resource_exhausted", "too many agent requests in flight");
    while (this.streams.has(this.nextStream) || this.nextStream === 0) {
      this.nextStream = (this.nextStream + 1) >>> 0;
    }
    const id = this.nextStream;
    this.nextStream = (this.nextStream + 1) >>> 0;
    this.streams.set(id, handler);
    return id;
  }

  /** Writes a frame (queued while reconnecting). False: wait for drain() before more. */
  private send(type: number, stream: number, fields: readonly FieldInput[] = []): boolean {
    if (this.closedError) throw this.closedError;
    const frame = encodeFrame(type, stream, fields);
    if (this.pending) {
      this.pending.push(frame);
      this.pendingBytes += frame.length;
      return this.pendingBytes < PENDING_SOFT_MAX;
    }
    return this.socket!.write(frame);
  }

  /** Tells the agent the host has given up `stream` (it stops the command, read or write). */
  private abandon(stream: number): void {
    if (stream === 0 || this.closedError) return;
    this.send(Msg.CANCEL, stream);
  }

  /**
   * Resolves once more can be written (or the connection ended). Callers race it with their
   * own deadline.
   */
  private async drain(): Promise<void> {
    if (this.closedError) return;
    if (this.pending) return firstOf(this, "resynced", "close");
    const s = this.socket;
    if (s?.writableNeedDrain) await firstOf(s, "drain", "close");
  }

  /** A flow for `stream` that credits the guest and keeps the connection's pause up to date. */
  private flowFor(stream: () => number, changed: (f: StreamFlow) => void): StreamFlow {
    const flow: StreamFlow = new StreamFlow(
      (bytes) => {
        const id = stream();
        if (this.streams.has(id) && !this.closedError) this.send(Msg.WINDOW, id, [[Tag.WINDOW, bytes]]);
      },
      () => {
        changed(flow);
        this.updatePause();
      },
    );
    return flow;
  }

  /** Pauses reading from the guest while an unpaced stream's consumer holds too much. */
  private updatePause(): void {
    let over = false;
    for (const f of this.flows.values()) if (f.held > HOLD_CAP) over = true;
    this.setPaused(over);
  }

  private setPaused(p: boolean): void {
    if (p === this.paused) return;
    this.paused = p;
    if (p) this.socket?.pause();
    else this.socket?.resume();
  }

  /**
   * A request whose stream ends with one OK/END (resolve) or ERROR (reject). `onFrame` sees
   * intermediate frames (DATA).
   */
  private request(
    type: number,
    fields: readonly FieldInput[],
    timeoutMs: number,
    onFrame?: (f: Frame) => void,
  ): Promise<Field[]> {
    return new Promise((resolve, reject) => {
      let stream = 0;
      const timer = setTimeout(() => {
        this.streams.delete(stream);
        reject(
          new ForkdError("timeout", `agent request 0x${type.toString(16)} timed out after ${timeoutMs} ms`),
        );
      }, timeoutMs);
      const finish = (err: ForkdError | null, fields?: Field[]) => {
        clearTimeout(timer);
        this.streams.delete(stream);
        if (err) reject(err);
        else resolve(fields ?? []);
      };
      try {
        stream = this.openStream((f) => {
          if (f instanceof ForkdError) return finish(f);
          if (f.type === Msg.OK || f.type === Msg.END) return finish(null, f.fields);
          if (f.type === Msg.ERROR) return finish(guestError(f.fields));
          if (onFrame) return onFrame(f);
          throw new ForkdError("agent_protocol", `unexpected frame 0x${f.type.toString(16)} from guest`);
        });
        this.send(type, stream, fields);
      } catch (e) {
        finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
      }
    });
  }

  async ping(timeoutMs = 5_000): Promise<PingResult> {
    const f = await this.request(Msg.PING, [], timeoutMs);
    return {
      version: intField(f, Tag.VERSION) ?? 0,
      uptimeMs: intField(f, Tag.UPTIME_MS) ?? 0,
      evalReady: intField(f, Tag.EVAL_READY) === 1,
    };
  }

  /** Gives a forked child its own identity: fresh kernel RNG, correct clock, hostname, id. */
  async identity(id: Identity, timeoutMs = 10_000): Promise<void> {
    await this.request(
      Msg.IDENTITY,
      [
        [Tag.SEED, randomBytes(64)],
        [Tag.TIME_NS, BigInt(Date.now()) * 1_000_000n],
        [Tag.HOSTNAME, id.hostname],
        [Tag.SANDBOX_ID, id.sandboxId],
        ...(id.pidsMax !== undefined ? ([[Tag.PIDS_MAX, BigInt(id.pidsMax)]] as const) : []),
        ...(id.netUpWaitMs ? [[Tag.NET_UP, BigInt(id.netUpWaitMs)] as const] : []),
      ],
      timeoutMs,
    );
  }

  async sync(timeoutMs = 60_000): Promise<void> {
    await this.request(Msg.SYNC, [], timeoutMs);
  }

  /**
   * Runs a command. Its output is paced by `handlers` (see ExecHandlers). Deadlines: STARTED
   * within STARTED_TIMEOUT_MS; with `timeoutMs`, EXIT within it plus EXEC_GRACE_MS, not counting
   * the time the consumer held a full window (the guest is then waiting on us).
   */
  exec(req: ExecRequest, handlers: ExecHandlers = {}): ExecHandle {
    const fields: FieldInput[] = [[Tag.WINDOW, WINDOW]];
    if (req.shell !== undefined) fields.push([Tag.SHELL, req.shell]);
    for (const a of req.argv ?? []) fields.push([Tag.ARG, a]);
    for (const [k, v] of Object.entries(req.env ?? {})) fields.push([Tag.ENV, `${k}=${v}`]);
    if (req.cwd !== undefined) fields.push([Tag.CWD, req.cwd]);
    if (req.timeoutMs !== undefined) fields.push([Tag.TIMEOUT_MS, req.timeoutMs]);
    if (req.stdin) fields.push([Tag.STDIN, 1]);

    let resolveStarted!: (v: { pid: number }) => void;
    let rejectStarted!: (e: Error) => void;
    const started = new Promise<{ pid: number }>((res, rej) => {
      resolveStarted = res;
      rejectStarted = rej;
    });
    started.catch(() => undefined); // observed through `result` too
    let stream = 0;
    const result = new Promise<ExecResult>((resolve, reject) => {
      let backstop: PausableTimer | undefined;
      const flow = this.flowFor(
        () => stream,
        (f) => (f.full ? backstop?.pause() : backstop?.resume()),
      );
      const finish = (err: ForkdError | null, r?: ExecResult) => {
        clearTimeout(startTimer);
        backstop?.clear();
        flow.end();
        this.streams.delete(stream);
        this.flows.delete(stream);
        this.updatePause();
        if (err) {
          rejectStarted(err);
          reject(err);
        } else resolve(r!);
      };
      const giveUp = (msg: string) => {
        this.abandon(stream);
        finish(new ForkdError("timeout", msg));
      };
      const startMs = req.startTimeoutMs ?? STARTED_TIMEOUT_MS;
      const startTimer = setTimeout(
        () => giveUp(`guest did not start the command within ${startMs} ms`),
        startMs,
      );
      // The guest enforces the command's timeout; ours is a backstop for a guest that never answers.
      if (req.timeoutMs !== undefined) {
        const ms = req.timeoutMs + EXEC_GRACE_MS;
        backstop = new PausableTimer(ms, () => giveUp(`guest did not finish exec within ${ms} ms`));
      }
      const output = (f: Frame, fn: ((chunk: Buffer) => Consumed) | undefined) => {
        const d = field(f.fields, Tag.DATA) ?? Buffer.alloc(0);
        flow.deliver(d.length, consume(fn, d));
      };
      try {
        stream = this.openStream((f) => {
          if (f instanceof ForkdError) return finish(f);
          switch (f.type) {
            case Msg.STARTED:
              clearTimeout(startTimer);
              if (intField(f.fields, Tag.WINDOW) !== undefined) flow.paced = true;
              return resolveStarted({ pid: intField(f.fields, Tag.PID) ?? -1 });
            case Msg.STDOUT:
              return output(f, handlers.onStdout);
            case Msg.STDERR:
              return output(f, handlers.onStderr);
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
              return finish(guestError(f.fields));
            default:
              throw new ForkdError("agent_protocol", `unexpected frame 0x${f.type.toString(16)} in exec`);
          }
        });
        this.flows.set(stream, flow);
        this.send(Msg.EXEC, stream, fields);
      } catch (e) {
        finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
      }
    });
    const sendOnStream = (type: number, fields: FieldInput[]) => {
      if (stream !== 0 && this.streams.has(stream) && !this.closedError) this.send(type, stream, fields);
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
    };
  }

  /** Reads a whole file, refusing one larger than `maxBytes` (the guest decides the size). */
  async readFile(path: string, opts: { maxBytes?: number; timeoutMs?: number } = {}): Promise<Buffer> {
    const max = opts.maxBytes ?? 256 << 20;
    const chunks: Buffer[] = [];
    let total = 0;
    await this.readFileStream(
      path,
      (chunk) => {
        total += chunk.length;
        if (total > max)
          throw new ForkdError("resource_exhausted", `file ${path} is larger than ${max} bytes`);
        chunks.push(Buffer.from(chunk));
      },
      opts.timeoutMs,
    );
    return Buffer.concat(chunks, total);
  }

  /**
   * Streams a file's bytes to `onChunk` (which paces the read by returning a promise, see
   * ExecHandlers); resolves with its size. `timeoutMs` bounds each wait for the guest: it runs
   * while the consumer is ready for more and restarts with every chunk. An exception or a
   * rejected promise from `onChunk` ends the read with that error.
   */
  readFileStream(path: string, onChunk: (chunk: Buffer) => Consumed, timeoutMs = 120_000): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      let stream = 0;
      let over = false;
      const flow = this.flowFor(
        () => stream,
        (f) => (f.full ? timer.pause() : timer.resume()),
      );
      const finish = (err: Error | null, size?: number) => {
        if (over) return;
        over = true;
        timer.clear();
        flow.end();
        this.streams.delete(stream);
        this.flows.delete(stream);
        this.updatePause();
        if (err) reject(err);
        else resolve(size ?? 0);
      };
      const stop = (err: Error) => {
        this.abandon(stream);
        finish(err);
      };
      const timer = new PausableTimer(timeoutMs, () =>
        stop(new ForkdError("timeout", `reading ${path}: the guest sent nothing for ${timeoutMs} ms`)),
      );
      try {
        stream = this.openStream((f) => {
          if (f instanceof ForkdError) return finish(f);
          if (f.type === Msg.END) return finish(null, intField(f.fields, Tag.SIZE) ?? 0);
          if (f.type === Msg.ERROR) return finish(guestError(f.fields));
          if (f.type !== Msg.DATA) throw new ForkdError("agent_protocol", "unexpected frame in read");
          if (intField(f.fields, Tag.WINDOW) !== undefined) flow.paced = true;
          timer.restart();
          const d = field(f.fields, Tag.DATA) ?? Buffer.alloc(0);
          let r: Consumed;
          try {
            r = onChunk(d);
          } catch (e) {
            return stop(e instanceof Error ? e : new Error(String(e)));
          }
          if (isThenable(r))
            r = Promise.resolve(r).catch((e: unknown) => stop(e instanceof Error ? e : new Error(String(e))));
          flow.deliver(d.length, r);
        });
        this.flows.set(stream, flow);
        this.send(Msg.READ, stream, [
          [Tag.PATH, path],
          [Tag.WINDOW, WINDOW],
        ]);
      } catch (e) {
        finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
      }
    });
  }

  /**
   * Writes a file atomically in the guest (temp file, fsync, rename). At `timeoutMs` it stops
   * sending, tells the agent to drop the temporary file and closes `data`.
   */
  async writeFile(
    path: string,
    data: Uint8Array | AsyncIterable<Uint8Array>,
    opts: { mode?: number; makeParents?: boolean; timeoutMs?: number } = {},
  ): Promise<number> {
    const timeoutMs = opts.timeoutMs ?? 120_000;
    let stream = 0;
    let early: ForkdError | null = null;
    const done = new Promise<Field[]>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.abandon(stream);
        finish(new ForkdError("timeout", `writing ${path} timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      const finish = (err: ForkdError | null, f?: Field[]) => {
        clearTimeout(timer);
        this.streams.delete(stream);
        if (err) {
          early ??= err;
          reject(err);
        } else resolve(f ?? []);
      };
      try {
        stream = this.openStream((f) => {
          if (f instanceof ForkdError) return finish(f);
          if (f.type === Msg.OK) return finish(null, f.fields);
          if (f.type === Msg.ERROR) return finish(guestError(f.fields));
          throw new ForkdError("agent_protocol", "unexpected frame in write");
        });
        const fields: FieldInput[] = [[Tag.PATH, path]];
        if (opts.mode !== undefined) fields.push([Tag.MODE, opts.mode]);
        if (opts.makeParents) fields.push([Tag.FLAGS, 1]);
        this.send(Msg.WRITE_OPEN, stream, fields);
      } catch (e) {
        finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
      }
    });
    done.catch(() => undefined);
    // Settles when the write is over, whichever way (the guest's reply, its error, the deadline).
    const over = done.then(
      () => null,
      () => null,
    );
    const sendChunk = async (buf: Uint8Array) => {
      for (let off = 0; off < buf.length && !early; off += CHUNK) {
        if (!this.send(Msg.WRITE_DATA, stream, [[Tag.DATA, buf.subarray(off, off + CHUNK)]]))
          await Promise.race([this.drain(), over]);
      }
    };
    if (!early && data instanceof Uint8Array) await sendChunk(data);
    else if (!early && !(data instanceof Uint8Array)) {
      const it = data[Symbol.asyncIterator]();
      for (;;) {
        const next = await Promise.race([it.next(), over]);
        if (early || next === null || next.done) break;
        await sendChunk(next.value);
      }
      // Ended early: the rest of the upload is not wanted (closes the request body).
      if (early) void Promise.resolve(it.return?.()).catch(() => undefined);
    }
    if (!early && !this.closedError) this.send(Msg.WRITE_END, stream);
    const f = await done;
    return intField(f, Tag.SIZE) ?? 0;
  }

  async stat(path: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<FileStat> {
    return toStat(await this.request(Msg.STAT, [[Tag.PATH, path]], timeoutMs));
  }

  async list(path: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<DirEntry[]> {
    const f = await this.request(Msg.LIST, [[Tag.PATH, path]], timeoutMs);
    const entries: DirEntry[] = [];
    let group: Field[] | null = null;
    const flush = () => {
      if (group) entries.push({ name: strField(group, Tag.NAME) ?? "", ...toStat(group) });
    };
    for (const x of f) {
      if (x.tag === Tag.NAME) {
        flush();
        group = [];
      }
      group?.push(x);
    }
    flush();
    return entries;
  }

  async mkdir(
    path: string,
    opts: { parents?: boolean; mode?: number } = {},
    timeoutMs = DEFAULT_TIMEOUT_MS,
  ): Promise<void> {
    const fields: FieldInput[] = [[Tag.PATH, path]];
    if (opts.mode !== undefined) fields.push([Tag.MODE, opts.mode]);
    if (opts.parents) fields.push([Tag.FLAGS, 1]);
    await this.request(Msg.MKDIR, fields, timeoutMs);
  }

  async remove(
    path: string,
    opts: { recursive?: boolean } = {},
    timeoutMs = DEFAULT_TIMEOUT_MS,
  ): Promise<void> {
    const fields: FieldInput[] = [[Tag.PATH, path]];
    if (opts.recursive) fields.push([Tag.FLAGS, 1]);
    await this.request(Msg.REMOVE, fields, timeoutMs);
  }

  async rename(from: string, to: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<void> {
    await this.request(
      Msg.RENAME,
      [
        [Tag.PATH, from],
        [Tag.PATH2, to],
      ],
      timeoutMs,
    );
  }

  async eval(code: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<EvalResult> {
    // The guest interrupts the cell at timeoutMs; allow it time to answer with the interruption.
    const f = await this.request(
      Msg.EVAL,
      [
        [Tag.CODE, code],
        [Tag.TIMEOUT_MS, timeoutMs],
      ],
      timeoutMs + 5_000,
    );
    const json = field(f, Tag.JSON);
    if (!json) throw new ForkdError("agent_protocol", "eval reply without JSON");
    return parseEvalJson(json);
  }
}

/** Resolves at the first of two events on `em`, then stops listening for both. */
function firstOf(em: EventEmitter, a: string, b: string): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      em.off(a, done);
      em.off(b, done);
      resolve();
    };
    em.on(a, done);
    em.on(b, done);
  });
}

function toStat(f: Field[]): FileStat {
  const t = intField(f, Tag.FILE_TYPE) ?? 4;
  return {
    type: FILE_TYPES[t as keyof typeof FILE_TYPES] ?? "other",
    size: intField(f, Tag.SIZE) ?? 0,
    mode: intField(f, Tag.MODE) ?? 0,
    mtimeMs: Math.floor((intField(f, Tag.MTIME_NS) ?? 0) / 1e6),
  };
}

const MIME_RE = /^[a-z]+\/[A-Za-z0-9.+-]{1,100}$/;

/** A guest-sent MIME bundle, keeping only well-formed entries (strings; any JSON for JSON types). */
function mimeBundle(v: unknown): MimeBundle | null {
  if (typeof v !== "object" || v === null || Array.isArray(v)) return null;
  const out: MimeBundle = {};
  for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
    if (!MIME_RE.test(k)) continue;
    if (typeof x === "string" || k.endsWith("json")) out[k] = x;
  }
  return Object.keys(out).length > 0 ? out : null;
}

/** Validates the interpreter's JSON: it comes from the guest. */
export function parseEvalJson(buf: Buffer): EvalResult {
  let v: unknown;
  try {
    v = JSON.parse(buf.toString("utf8"));
  } catch {
    throw new ForkdError("agent_protocol", "eval reply is not JSON");
  }
  const o = v as Record<string, unknown>;
  const str = (x: unknown) => (typeof x === "string" ? x : "");
  if (typeof o !== "object" || o === null || typeof o.ok !== "boolean") {
    throw new ForkdError("agent_protocol", "eval reply has the wrong shape");
  }
  const err = o.error as Record<string, unknown> | null | undefined;
  return {
    ok: o.ok,
    value: typeof o.value === "string" ? o.value : null,
    value_data: mimeBundle(o.value_data),
    display: Array.isArray(o.display)
      ? o.display.map(mimeBundle).filter((b): b is MimeBundle => b !== null)
      : [],
    stdout: str(o.stdout),
    stderr: str(o.stderr),
    error:
      err && typeof err === "object"
        ? { name: str(err.name), value: str(err.value), traceback: str(err.traceback) }
        : null,
  };
}
