/**
 * One connection to the guest agent over a VM's virtio-serial unix socket: framing (codec.ts),
 * the streams in flight (streams.ts) and their replies, every request's deadline, and the pause
 * of the whole connection while an unpaced stream's consumer holds too much (flow.ts). Anything
 * malformed from the guest fails the requests in flight and the connection is made again and
 * resynchronised (a few times a minute at most, resync-budget.ts; past that it gives up and
 * emits "broken" with the reason).
 *
 * Events: "close" (the error that ended it, once), "broken" (why it gave up on the guest),
 * "resynced" (made again after garbage; queued frames written).
 */
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";
import { ForkdError, errorMessage } from "../util/index.js";
import { sleep } from "../util/index.js";
import { FrameDecoder, Msg, Tag, encodeFrame } from "./codec.js";
import type { Field, FieldInput, Frame } from "./codec.js";
import { StreamFlow, WINDOW } from "./flow.js";
import { guestError } from "./guest-error.js";
import { ResyncBudget } from "./resync-budget.js";
import { StreamTable } from "./streams.js";
import type { StreamHandler } from "./streams.js";

/** How long a one-reply request waits unless its caller says otherwise. */
export const DEFAULT_TIMEOUT_MS = 30_000;
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

const asProtocolError = (e: unknown): ForkdError =>
  e instanceof ForkdError ? e : new ForkdError("agent_protocol", errorMessage(e));

export class AgentConnection extends EventEmitter {
  private socket: Socket | null = null;
  private decoder = new FrameDecoder();
  private readonly streams = new StreamTable();
  private closedError: ForkdError | null = null;
  /** Frames sent while reconnecting; written once the channel answers again. */
  private pending: Buffer[] | null = null;
  private pendingBytes = 0;
  /** While reconnecting: fails the resynchronising PING (garbage again, or closed). */
  private probeFail: ((e: ForkdError) => void) | null = null;
  private readonly resyncs = new ResyncBudget(RESYNC_MAX, RESYNC_WINDOW_MS);
  private paused = false;

  /** Without `redial`, garbage from the guest closes the connection for good. */
  constructor(
    socket: Socket,
    private readonly redial: (() => Promise<Socket>) | null,
  ) {
    super();
    this.attach(socket);
  }

  get closed(): boolean {
    return this.closedError !== null;
  }

  /** Whether frames may still go to `stream`: it is in flight on a connection not closed. */
  isOpen(stream: number): boolean {
    return stream !== 0 && this.streams.has(stream) && !this.closedError;
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
      const h = this.streams.handler(f.stream);
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
    if (!this.redial || !this.resyncs.take()) {
      this.giveUp(err);
      return;
    }
    this.dropSocket();
    this.pending = [];
    this.pendingBytes = 0;
    this.setPaused(false);
    const abandoned = this.streams.ids();
    this.streams.failAll(
      new ForkdError("agent_protocol", `the guest corrupted its agent channel (${err.message}); reconnected`),
    );
    void this.resync(abandoned);
  }

  /** Corrupted too often (or cannot reconnect): closed for good, and the owner is told why. */
  private giveUp(err: ForkdError): void {
    const n = this.resyncs.used + 1;
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
      if (!this.resyncs.take()) {
        this.giveUp(error);
        return;
      }
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
        this.streams.end(stream);
        if (e) reject(e);
        else resolve();
      };
      const timer = setTimeout(
        () => done(new ForkdError("timeout", `agent did not answer PING within ${RESYNC_PING_MS} ms`)),
        RESYNC_PING_MS,
      );
      this.probeFail = done;
      stream = this.open((f) => {
        if (f instanceof ForkdError) return done(f);
        if (f.type === Msg.OK) return done(null);
        done(new ForkdError("agent_protocol", `unexpected frame 0x${f.type.toString(16)} for PING`));
      });
      this.socket!.write(encodeFrame(Msg.PING, stream));
    });
  }

  /** Breaks the connection for good: every pending request fails with `err`. Idempotent. */
  private fail(err: ForkdError): void {
    if (this.closedError) return;
    this.closedError = err;
    this.dropSocket();
    this.pending = null;
    this.probeFail?.(err);
    this.streams.failAll(err);
    this.emit("close", err);
  }

  close(): void {
    this.fail(new ForkdError("unavailable", "agent connection closed by host"));
  }

  /** A new stream for `handler` (and `flow`, for a paced stream). Throws once closed. */
  open(handler: StreamHandler, flow?: StreamFlow): number {
    if (this.closedError) throw this.closedError;
    return this.streams.open(handler, flow);
  }

  /** Takes a stream an earlier host left in flight in the guest (streams.ts claim()). */
  claim(stream: number, handler: StreamHandler, flow?: StreamFlow): void {
    if (this.closedError) throw this.closedError;
    this.streams.claim(stream, handler, flow);
  }

  /** New streams are numbered past `stream` (the guest has ids up to it in flight). */
  numberPast(stream: number): void {
    this.streams.numberPast(stream);
  }

  /** Forgets `stream` (its later frames are dropped) and re-checks the connection's pause. */
  end(stream: number): void {
    this.streams.end(stream);
    this.updatePause();
  }

  /** Writes a frame (queued while reconnecting). False: wait for drain() before more. */
  send(type: number, stream: number, fields: readonly FieldInput[] = []): boolean {
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
  abandon(stream: number): void {
    if (stream === 0 || this.closedError) return;
    this.send(Msg.CANCEL, stream);
  }

  /**
   * Resolves once more can be written (or the connection ended). Callers race it with their
   * own deadline.
   */
  async drain(): Promise<void> {
    if (this.closedError) return;
    if (this.pending) return firstOf(this, "resynced", "close");
    const s = this.socket;
    if (s?.writableNeedDrain) await firstOf(s, "drain", "close");
  }

  /**
   * A flow for a paced stream (`stream()`: its id once open) that credits the guest and keeps
   * the connection's pause up to date; `changed` hears of every change in what it holds.
   */
  flow(stream: () => number, changed: (f: StreamFlow) => void): StreamFlow {
    const flow: StreamFlow = new StreamFlow(
      (bytes) => {
        const id = stream();
        if (this.isOpen(id)) this.send(Msg.WINDOW, id, [[Tag.WINDOW, bytes]]);
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
    this.setPaused(this.streams.holdsOver(HOLD_CAP));
  }

  private setPaused(p: boolean): void {
    if (p === this.paused) return;
    this.paused = p;
    if (p) this.socket?.pause();
    else this.socket?.resume();
  }

  /**
   * A request whose stream ends with one OK/END (resolve) or ERROR (reject). `onFrame` sees
   * intermediate frames (DATA). `on`: a stream of the caller's (HANDOVER_STREAM), not a new one.
   */
  request(
    type: number,
    fields: readonly FieldInput[],
    timeoutMs: number,
    onFrame?: (f: Frame) => void,
    on?: number,
  ): Promise<Field[]> {
    return new Promise((resolve, reject) => {
      let stream = on ?? 0;
      const timer = setTimeout(() => {
        this.streams.end(stream);
        reject(
          new ForkdError("timeout", `agent request 0x${type.toString(16)} timed out after ${timeoutMs} ms`),
        );
      }, timeoutMs);
      const finish = (err: ForkdError | null, fields?: Field[]) => {
        clearTimeout(timer);
        this.streams.end(stream);
        if (err) reject(err);
        else resolve(fields ?? []);
      };
      try {
        const handler: StreamHandler = (f) => {
          if (f instanceof ForkdError) return finish(f);
          if (f.type === Msg.OK || f.type === Msg.END) return finish(null, f.fields);
          if (f.type === Msg.ERROR) return finish(guestError(f.fields));
          if (onFrame) return onFrame(f);
          throw new ForkdError("agent_protocol", `unexpected frame 0x${f.type.toString(16)} from guest`);
        };
        if (on === undefined) stream = this.open(handler);
        else this.claim(on, handler);
        this.send(type, stream, fields);
      } catch (e) {
        finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
      }
    });
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
