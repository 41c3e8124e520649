/**
 * Host side of the guest agent protocol over a VM's virtio-serial unix socket.
 * One connection multiplexes many concurrent streams; every request has a deadline; anything
 * malformed from the guest breaks the connection and fails the requests on it.
 */
import { randomBytes } from "node:crypto";
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import { ForkdError, errorMessage } from "../util/errors.js";
import { dialUnix } from "../util/net.js";
import { CHUNK, FrameDecoder, Msg, Tag, encodeFrame, field, intField, strField } from "./codec.js";
import type { Field, FieldInput, Frame } from "./codec.js";
import { errnoCode, errnoName } from "./errno.js";

export interface ExecRequest {
  /** argv, or a shell string run with /bin/sh -c. */
  argv?: string[];
  shell?: string;
  env?: Record<string, string>;
  cwd?: string;
  timeoutMs?: number;
  /** Keep stdin open for writeStdin(); otherwise it is /dev/null. */
  stdin?: boolean;
}

export interface ExecResult {
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
}

export interface ExecHandlers {
  onStdout?: (chunk: Buffer) => void;
  onStderr?: (chunk: Buffer) => void;
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

type StreamHandler = (frame: Frame) => void;

const FILE_TYPES = { 1: "file", 2: "dir", 3: "symlink", 4: "other" } as const;
const DEFAULT_TIMEOUT_MS = 30_000;
const MAX_STREAMS = 1024;

export function guestError(fields: Field[]): ForkdError {
  const errno = intField(fields, Tag.ERRNO) ?? 0;
  const message = strField(fields, Tag.MESSAGE) ?? "guest error";
  return new ForkdError(errnoCode(errno), message, { errno, errno_name: errnoName(errno) });
}

export class AgentClient extends EventEmitter {
  private socket: Socket | null = null;
  private readonly decoder = new FrameDecoder();
  private readonly streams = new Map<number, StreamHandler>();
  private nextStream = 1;
  private closedError: ForkdError | null = null;

  private constructor(readonly socketPath: string) {
    super();
  }

  /**
   * Connects to the agent's socket, retrying while it does not exist yet (QEMU still starting).
   */
  static async connect(socketPath: string, timeoutMs = 10_000, signal?: AbortSignal): Promise<AgentClient> {
    const client = new AgentClient(socketPath);
    client.socket = await dialUnix(socketPath, timeoutMs, "agent", signal);
    client.attach();
    return client;
  }

  /** Wraps an already connected stream (tests: one end of a socketpair to an agent process). */
  static fromSocket(socket: Socket, label = "socket"): AgentClient {
    const client = new AgentClient(label);
    client.socket = socket;
    client.attach();
    return client;
  }

  get closed(): boolean {
    return this.closedError !== null;
  }

  private attach(): void {
    const s = this.socket!;
    s.setNoDelay(true);
    s.on("data", (chunk: Buffer) => {
      let frames: Frame[];
      try {
        frames = this.decoder.push(chunk);
      } catch (e) {
        this.fail(e instanceof ForkdError ? e : new ForkdError("agent_protocol", errorMessage(e)));
        return;
      }
      for (const f of frames) {
        const h = this.streams.get(f.stream);
        if (h) {
          try {
            h(f);
          } catch (e) {
            this.fail(e instanceof ForkdError ? e : new ForkdError("agent_protocol", errorMessage(e)));
            return;
          }
        }
        // Frames for unknown streams (late output after a timeout) are dropped.
      }
    });
    s.on("error", (e) => this.fail(new ForkdError("unavailable", `agent connection: ${e.message}`)));
    s.on("close", () => this.fail(new ForkdError("unavailable", "agent connection closed")));
  }

  /** Breaks the connection: every pending request fails with `err`. Idempotent. */
  private fail(err: ForkdError): void {
    if (this.closedError) return;
    this.closedError = err;
    this.socket?.destroy();
    const handlers = [...this.streams.values()];
    this.streams.clear();
    const errFrame: Frame = {
      type: -1,
      stream: 0,
      fields: [],
    };
    for (const h of handlers) {
      try {
        h(errFrame);
      } catch {
        /* handlers reject their own promises */
      }
    }
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

  private send(type: number, stream: number, fields: readonly FieldInput[] = []): boolean {
    if (this.closedError) throw this.closedError;
    return this.socket!.write(encodeFrame(type, stream, fields));
  }

  private async drain(): Promise<void> {
    const s = this.socket;
    if (!s || this.closedError) return;
    if (s.writableNeedDrain) {
      await new Promise<void>((resolve) => {
        const done = () => {
          s.off("drain", done);
          s.off("close", done);
          resolve();
        };
        s.on("drain", done);
        s.on("close", done);
      });
    }
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
          if (f.type === -1) return finish(this.closedError);
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

  exec(req: ExecRequest, handlers: ExecHandlers = {}): ExecHandle {
    const fields: FieldInput[] = [];
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
    // The guest enforces the command's timeout; ours is a backstop for a guest that never answers.
    const backstopMs = req.timeoutMs !== undefined ? req.timeoutMs + 10_000 : undefined;
    const result = new Promise<ExecResult>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const finish = (err: ForkdError | null, r?: ExecResult) => {
        clearTimeout(timer);
        this.streams.delete(stream);
        if (err) {
          rejectStarted(err);
          reject(err);
        } else resolve(r!);
      };
      if (backstopMs !== undefined) {
        timer = setTimeout(
          () => finish(new ForkdError("timeout", `guest did not finish exec within ${backstopMs} ms`)),
          backstopMs,
        );
      }
      try {
        stream = this.openStream((f) => {
          switch (f.type) {
            case -1:
              return finish(this.closedError);
            case Msg.STARTED:
              return resolveStarted({ pid: intField(f.fields, Tag.PID) ?? -1 });
            case Msg.STDOUT:
              return handlers.onStdout?.(field(f.fields, Tag.DATA) ?? Buffer.alloc(0));
            case Msg.STDERR:
              return handlers.onStderr?.(field(f.fields, Tag.DATA) ?? Buffer.alloc(0));
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

  /** Streams a file's bytes to `onChunk`; resolves with its size. */
  async readFileStream(path: string, onChunk: (chunk: Buffer) => void, timeoutMs = 120_000): Promise<number> {
    const failed: { error: Error | null } = { error: null };
    const f = await this.request(Msg.READ, [[Tag.PATH, path]], timeoutMs, (frame) => {
      if (frame.type !== Msg.DATA) throw new ForkdError("agent_protocol", "unexpected frame in read");
      if (failed.error) return;
      try {
        onChunk(field(frame.fields, Tag.DATA) ?? Buffer.alloc(0));
      } catch (e) {
        failed.error = e instanceof Error ? e : new Error(String(e));
      }
    });
    if (failed.error) throw failed.error;
    return intField(f, Tag.SIZE) ?? 0;
  }

  /** Writes a file atomically in the guest (temp file, fsync, rename). */
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
        this.streams.delete(stream);
        reject(new ForkdError("timeout", `writing ${path} timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      const finish = (err: ForkdError | null, f?: Field[]) => {
        clearTimeout(timer);
        this.streams.delete(stream);
        if (err) {
          early = err;
          reject(err);
        } else resolve(f ?? []);
      };
      stream = this.openStream((f) => {
        if (f.type === -1) return finish(this.closedError);
        if (f.type === Msg.OK) return finish(null, f.fields);
        if (f.type === Msg.ERROR) return finish(guestError(f.fields));
        throw new ForkdError("agent_protocol", "unexpected frame in write");
      });
    });
    done.catch(() => undefined);
    const fields: FieldInput[] = [[Tag.PATH, path]];
    if (opts.mode !== undefined) fields.push([Tag.MODE, opts.mode]);
    if (opts.makeParents) fields.push([Tag.FLAGS, 1]);
    this.send(Msg.WRITE_OPEN, stream, fields);
    const sendChunk = async (buf: Uint8Array) => {
      for (let off = 0; off < buf.length && !early; off += CHUNK) {
        if (!this.send(Msg.WRITE_DATA, stream, [[Tag.DATA, buf.subarray(off, off + CHUNK)]]))
          await this.drain();
      }
    };
    if (data instanceof Uint8Array) await sendChunk(data);
    else
      for await (const chunk of data) {
        if (early) break;
        await sendChunk(chunk);
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
