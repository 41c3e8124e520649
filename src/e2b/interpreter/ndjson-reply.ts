/**
 * A streamed NDJSON reply on a node:http response that survives its client: the status and
 * headers go out with start() (at once, before any line: a client's timeout of the body starts
 * there, as E2B's server commits its stream once the request is accepted) or else with the
 * first line (a failure before either can still be a plain HTTP error), lines written after the
 * client hung up are dropped, and `signal` aborts when it hangs up before the reply ended.
 * `drained()` lets a producer that can wait be paced by its reader; cut() ends the connection
 * the way a VM that died under the stream would.
 */
import type { IncomingMessage, ServerResponse } from "node:http";

export class NdjsonReply {
  private readonly ac = new AbortController();
  private ended = false;

  constructor(
    req: IncomingMessage,
    private readonly res: ServerResponse,
  ) {
    const gone = () => {
      if (!this.ended) this.ac.abort();
    };
    res.on("close", gone);
    req.on("close", () => {
      if (!res.writableFinished && req.destroyed && res.destroyed) gone();
    });
    res.on("error", () => gone());
  }

  /** Aborts when the client is gone before the reply ended. */
  get signal(): AbortSignal {
    return this.ac.signal;
  }

  get gone(): boolean {
    return this.ac.signal.aborted || this.res.destroyed;
  }

  /** Whether any line was sent (the status is committed). */
  get started(): boolean {
    return this.res.headersSent;
  }

  /** Commits the reply: its status and headers go out now. */
  start(): void {
    if (this.ended || this.gone || this.res.headersSent) return;
    this.res.writeHead(200, { "content-type": "application/x-ndjson", "cache-control": "no-store" });
    this.res.flushHeaders();
  }

  /** Queues one line; true while the client wants more now. */
  line(value: unknown): boolean {
    if (this.ended || this.gone) return false;
    this.start();
    return this.res.write(JSON.stringify(value) + "\n");
  }

  /** Ends the connection without ending the reply (what its client sees when a sandbox dies). */
  cut(): void {
    if (this.ended) return;
    this.ended = true;
    this.res.destroy();
  }

  /** Resolves once the client wants more, or is gone. */
  drained(): Promise<void> {
    if (!this.res.writableNeedDrain || this.gone) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        this.res.off("drain", done);
        this.res.off("close", done);
        resolve();
      };
      this.res.on("drain", done);
      this.res.on("close", done);
    });
  }

  /** Ends the reply (an empty 200 if nothing was sent). Idempotent. */
  end(): void {
    if (this.ended) return;
    this.ended = true;
    if (this.gone) return;
    if (!this.res.headersSent) this.res.writeHead(200, { "content-type": "application/x-ndjson" });
    this.res.end();
  }

  /** A plain HTTP error instead of the stream, if nothing was sent yet; else the reply is cut. */
  fail(status: number, message: string): void {
    if (this.ended) return;
    this.ended = true;
    if (this.gone) return;
    if (this.res.headersSent) {
      this.res.destroy();
      return;
    }
    this.res.writeHead(status, { "content-type": "text/plain; charset=utf-8" });
    this.res.end(message);
  }
}
