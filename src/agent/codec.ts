/**
 * Frame and field codec of the guest agent protocol (docs/agent-protocol.md, version 1).
 * Everything decoded here came from a guest: lengths are bounded before anything is buffered.
 */
import { ForkdError } from "../util/index.js";

export const PROTOCOL_VERSION = 1;
export const MAX_FRAME = (1 << 20) + 64;
/** Largest DATA payload we put in one frame. */
export const CHUNK = 64 * 1024;

export const Msg = {
  PING: 0x01,
  IDENTITY: 0x02,
  SYNC: 0x03,
  /** Credit for a paced stream (host to guest). */
  WINDOW: 0x04,
  /** The host abandons a stream: the agent stops it without a reply. */
  CANCEL: 0x05,
  /** A new host takes over: what an earlier one left in flight (handover.ts). */
  STREAMS: 0x06,
  EXEC: 0x10,
  STDIN: 0x11,
  SIGNAL: 0x12,
  /** A PTY exec's new window size (rows, cols). */
  RESIZE: 0x13,
  READ: 0x20,
  WRITE_OPEN: 0x21,
  WRITE_DATA: 0x22,
  WRITE_END: 0x23,
  LIST: 0x24,
  STAT: 0x25,
  MKDIR: 0x26,
  REMOVE: 0x27,
  RENAME: 0x28,
  /** Watch a directory (inotify); its events arrive as WATCH_EVENT until CANCEL. */
  WATCH: 0x29,
  EVAL: 0x30,
  /** The host gives up the cell on that stream: dropped if waiting, else interrupted. */
  EVAL_INTERRUPT: 0x31,
  OK: 0x81,
  DATA: 0x82,
  END: 0x83,
  ERROR: 0x8f,
  STARTED: 0x90,
  STDOUT: 0x91,
  STDERR: 0x92,
  EXIT: 0x93,
  WATCH_EVENT: 0x94,
  /** A streamed EVAL's output while the cell runs {DATA}. */
  EVAL_STDOUT: 0x96,
  EVAL_STDERR: 0x97,
} as const;

export const Tag = {
  ARG: 1,
  ENV: 2,
  CWD: 3,
  SHELL: 4,
  TIMEOUT_MS: 5,
  STDIN: 6,
  PATH: 7,
  PATH2: 8,
  MODE: 9,
  FLAGS: 10,
  DATA: 11,
  CODE: 12,
  SEED: 13,
  TIME_NS: 14,
  HOSTNAME: 15,
  SANDBOX_ID: 16,
  SIGNAL: 17,
  /** The workload cgroup's pids.max (IDENTITY; 0: unlimited). */
  PIDS_MAX: 18,
  NET_UP: 19,
  /** EXEC/READ: initial window; STARTED / first DATA: the agent honours it; WINDOW: credit. */
  WINDOW: 20,
  /** EXEC: the user to run as (`name`, `uid`, `name:group`, `uid:gid`); absent: the image's default. */
  USER: 21,
  /** EVAL: the kernel ("python", "javascript"); absent: python. */
  LANGUAGE: 22,
  /** EXEC: run on a pseudo-terminal of this size (STARTED echoes them); RESIZE: the new size. */
  PTY_ROWS: 23,
  PTY_COLS: 24,
  /** WATCH: watch subdirectories too (those there at start and those made later). */
  RECURSIVE: 25,
  /** WATCH_EVENT: "create", "write", "remove", "rename", "chmod" or "overflow". */
  EVENT: 26,
  /** EVAL: one line of JSON for the kernel (context, env, stream, or a context operation). */
  EVAL_OPTS: 27,
  VERSION: 32,
  PID: 33,
  EXIT_CODE: 34,
  EXIT_SIGNAL: 35,
  TIMED_OUT: 36,
  ERRNO: 37,
  MESSAGE: 38,
  SIZE: 39,
  MTIME_NS: 40,
  FILE_TYPE: 41,
  NAME: 42,
  JSON: 44,
  UPTIME_MS: 45,
  EVAL_READY: 46,
  /** PING reply: the kernels the image has, comma-separated (absent: an agent older than kernels). */
  KERNELS: 47,
  /** STREAMS reply: a stream in flight (each starts an entry), its kind, whether on a PTY. */
  STREAM: 48,
  KIND: 49,
  PTY: 50,
  /** PING reply: optional behaviours of the agent, comma-separated (`file-user`; absent: none). */
  FEATURES: 51,
} as const;

export type FieldValue = string | Uint8Array | bigint | number;
export type FieldInput = readonly [tag: number, value: FieldValue];

export interface Field {
  tag: number;
  value: Buffer;
}

export interface Frame {
  type: number;
  stream: number;
  fields: Field[];
}

function fieldBytes(value: FieldValue): Buffer {
  if (typeof value === "string") return Buffer.from(value, "utf8");
  if (typeof value === "number" || typeof value === "bigint") {
    const b = Buffer.alloc(8);
    b.writeBigInt64BE(BigInt(value));
    return b;
  }
  return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
}

export function encodeFrame(type: number, stream: number, fields: readonly FieldInput[] = []): Buffer {
  const values = fields.map(([tag, v]) => [tag, fieldBytes(v)] as const);
  const payload = values.reduce((n, [, b]) => n + 5 + b.length, 0);
  const length = 5 + payload;
  if (length > MAX_FRAME)
    throw new ForkdError("invalid_argument", `agent frame of ${length} bytes exceeds ${MAX_FRAME}`);
  const out = Buffer.allocUnsafe(4 + length);
  out.writeUInt32BE(length, 0);
  out.writeUInt8(type, 4);
  out.writeUInt32BE(stream, 5);
  let off = 9;
  for (const [tag, b] of values) {
    out.writeUInt8(tag, off);
    out.writeUInt32BE(b.length, off + 1);
    b.copy(out, off + 5);
    off += 5 + b.length;
  }
  return out;
}

export function decodeFields(payload: Buffer): Field[] {
  const fields: Field[] = [];
  let off = 0;
  while (off < payload.length) {
    if (payload.length - off < 5) throw new ForkdError("agent_protocol", "truncated field header from guest");
    const tag = payload.readUInt8(off);
    const len = payload.readUInt32BE(off + 1);
    if (len > payload.length - off - 5) throw new ForkdError("agent_protocol", "field overruns its frame");
    fields.push({ tag, value: payload.subarray(off + 5, off + 5 + len) });
    off += 5 + len;
  }
  return fields;
}

/** Incremental decoder for the byte stream from a guest. Throws `agent_protocol` on garbage. */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;

  push(chunk: Buffer): Frame[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const frames: Frame[] = [];
    for (;;) {
      if (this.buffered < 4) break;
      const head = this.peek(4);
      const length = head.readUInt32BE(0);
      if (length < 5 || length > MAX_FRAME) {
        throw new ForkdError("agent_protocol", `guest sent a frame length of ${length}`);
      }
      if (this.buffered < 4 + length) break;
      const frame = this.take(4 + length);
      frames.push({
        type: frame.readUInt8(4),
        stream: frame.readUInt32BE(5),
        fields: decodeFields(frame.subarray(9)),
      });
    }
    return frames;
  }

  private peek(n: number): Buffer {
    if (this.chunks[0]!.length < n) this.chunks = [Buffer.concat(this.chunks)];
    return this.chunks[0]!.subarray(0, n);
  }

  private take(n: number): Buffer {
    const all = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
    const out = all.subarray(0, n);
    const rest = all.subarray(n);
    this.chunks = rest.length > 0 ? [rest] : [];
    this.buffered = rest.length;
    return out;
  }
}

export const field = (f: Field[], tag: number): Buffer | undefined => f.find((x) => x.tag === tag)?.value;

export function intField(f: Field[], tag: number): number | undefined {
  const v = field(f, tag);
  if (v === undefined) return undefined;
  if (v.length !== 8) throw new ForkdError("agent_protocol", `integer field ${tag} has ${v.length} bytes`);
  return Number(v.readBigInt64BE(0));
}

export const strField = (f: Field[], tag: number): string | undefined => field(f, tag)?.toString("utf8");
