/**
 * The body of a streamed reply that survives its client. Whatever the work producing it writes
 * after the client hung up (or after the reply ended) is dropped, never thrown, and the work is
 * told the client is gone (onHangup), also when the client left before the reply started: the
 * HTTP server never reads, so never cancels, a body whose connection was already closed.
 *
 * The body is bounded: write() says whether the client wants more now, and drained() waits
 * until it does (or is gone), so a producer that can wait is paced by its reader; a reader that
 * takes nothing for `stallMs` while the producer waits is taken for gone.
 */
import type { ServerResponse } from "node:http";
import { Writable } from "node:stream";
import { ForkdError } from "../util/index.js";

export interface ReplySink {
  /** The client hung up before the reply ended. */
  readonly gone: boolean;
  /** Nothing more is sent: the reply ended, failed, or its client is gone. */
  readonly done: boolean;
  /** Queues bytes; true while the client wants more now. Dropped once done. */
  write(chunk: Uint8Array): boolean;
  /** Queues one NDJSON line (the value as JSON and a newline), as write(). */
  line(value: unknown): boolean;
  /** Resolves once the client wants more, or nothing more is sent. */
  drained(): Promise<void>;
  /** Ends the reply after what is queued. Idempotent; a no-op once done. */
  end(): void;
  /** Cuts the reply (the client sees a broken transfer). A no-op once done. */
  fail(error: unknown): void;
  /** Calls `fn` once when the client hangs up; at once if it is already gone. */
  onHangup(fn: () => void): void;
  /** A Node writable into this reply (pipelines): destroyed with an error when the client goes. */
  writable(): Writable;
}

export interface ReplyStreamOptions {
  /** The HTTP response the body is sent on (node-server's `c.env.outgoing`; absent in app.request). */
  outgoing?: ServerResponse | undefined;
  /** Bytes queued before write() says to wait (1 MiB). */
  highWaterMark?: number;
  /**
   * How long a producer may wait in drained() for a reader that takes nothing (10 min): past
   * it the client counts as gone (its connection is cut), so a reader that stopped for good
   * does not hold its work, and the sandbox it leases, forever.
   */
  stallMs?: number;
}

/** A reader that took nothing for this long while the producer waited has hung up. */
export const REPLY_STALL_MS = 10 * 60_000;

/** The error a writer into a reply sees once its client is gone. */
export const clientGone = (): ForkdError => new ForkdError("unavailable", "the client went away");

/** What cuts a body whose connection closed: node-server reports this code as a user abort. */
const aborted = (): Error =>
  Object.assign(new Error("the client went away"), { code: "ERR_STREAM_PREMATURE_CLOSE" });

const enc = new TextEncoder();

/** A reply body fed by `start(sink)`, which is called at once. */
export function replyStream(
  start: (sink: ReplySink) => void,
  opts: ReplyStreamOptions = {},
): ReadableStream<Uint8Array> {
  let controller: ReadableStreamDefaultController<Uint8Array> | null = null;
  let state: "open" | "ended" | "gone" = "open";
  let hangups: (() => void)[] = [];
  let waiters: (() => void)[] = [];
  let stall: NodeJS.Timeout | null = null;
  const wake = () => {
    if (stall) clearTimeout(stall);
    stall = null;
    const w = waiters;
    waiters = [];
    for (const f of w) f();
  };
  const call = (fn: () => void) => {
    try {
      fn();
    } catch {
      // A hang-up handler's own failure (e.g. signalling a command on a lost agent connection)
      // has nobody left to report to; it must not reach the process.
    }
  };
  /**
   * How the body learnt it: the reader cancelled it; the connection closed under a reader that
   * may wait on it forever (the body is cut: the error the HTTP server takes for an abort); or
   * it closed before any reader came (the body is ended: the server, reading it later, finds
   * its end and finishes quietly).
   */
  const hangup = (how: "cancelled" | "closed" | "never") => {
    if (state !== "open") return;
    state = "gone";
    try {
      if (how === "closed") controller?.error(aborted());
      if (how === "never") controller?.close();
    } catch {
      /* already cancelled */
    }
    wake();
    const fns = hangups;
    hangups = [];
    for (const fn of fns) call(fn);
  };
  const wants = () => state === "open" && (controller?.desiredSize ?? 0) > 0;

  const sink: ReplySink = {
    get gone() {
      return state === "gone";
    },
    get done() {
      return state !== "open";
    },
    write(chunk) {
      if (state !== "open" || !controller) return false;
      try {
        controller.enqueue(chunk);
      } catch {
        // Cancelled in a way we did not see: the client is gone all the same.
        hangup("cancelled");
        return false;
      }
      return wants();
    },
    line(value) {
      return sink.write(enc.encode(JSON.stringify(value) + "\n"));
    },
    drained() {
      if (state !== "open" || wants()) return Promise.resolve();
      stall ??= setTimeout(() => {
        stall = null;
        hangup("closed");
        opts.outgoing?.destroy();
      }, opts.stallMs ?? REPLY_STALL_MS);
      return new Promise((resolve) => waiters.push(resolve));
    },
    end() {
      if (state !== "open") return;
      state = "ended";
      try {
        controller?.close();
      } catch {
        /* already closed by a cancel we did not see */
      }
      wake();
    },
    fail(error) {
      if (state !== "open") return;
      state = "ended";
      try {
        controller?.error(error);
      } catch {
        /* already closed */
      }
      wake();
    },
    onHangup(fn) {
      if (state === "gone") call(fn);
      else if (state === "open") hangups.push(fn);
    },
    writable() {
      const w = new Writable({
        write(chunk: Buffer, _encoding, cb) {
          if (state === "gone") return cb(clientGone());
          if (sink.write(chunk)) return cb();
          void sink.drained().then(() => cb(state === "gone" ? clientGone() : null));
        },
        final(cb) {
          sink.end();
          cb();
        },
        destroy(error, cb) {
          if (error) sink.fail(error);
          cb(error);
        },
      });
      // The writer learns of the hang-up from its own pipeline or write callbacks, also when it
      // attaches them later: the error must not be an unhandled 'error' event meanwhile.
      w.on("error", () => undefined);
      sink.onHangup(() => w.destroy(clientGone()));
      return w;
    },
  };

  const hwm = opts.highWaterMark ?? 1 << 20;
  const stream = new ReadableStream<Uint8Array>(
    {
      start(c) {
        controller = c;
      },
      pull() {
        wake();
      },
      cancel() {
        hangup("cancelled");
      },
    },
    { highWaterMark: hwm, size: (chunk) => chunk.byteLength },
  );

  // A connection that closed before the reply finished is a hang-up, whether or not the server
  // got as far as reading (and so cancelling) this body.
  const out = opts.outgoing;
  if (out) {
    if (out.destroyed && !out.writableFinished) hangup("never");
    // After the server's own listener (it cancels a body it reads), so this one only cuts a
    // body nobody will cancel.
    else out.once("close", () => setImmediate(() => out.writableFinished || hangup("closed")));
  }
  start(sink);
  return stream;
}
