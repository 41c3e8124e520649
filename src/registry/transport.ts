/**
 * HTTP for registries and pack URLs, over Node's global fetch: a scheme policy checked on every
 * hop (https, or plain http only where allowed), redirects followed by hand (at most 5, the
 * Authorization header dropped when the origin changes), and an idle timeout that aborts a
 * request making no progress (headers, or a body chunk in either direction).
 */
import { Readable, Transform } from "node:stream";
import type { ReadableStream as WebReadable } from "node:stream/web";
import { ForkdError, errorMessage } from "../util/errors.js";
import { isLoopback } from "./ref.js";

export interface SchemePolicy {
  /** Plain http to non-loopback hosts (the user said --insecure, or listed the host). */
  insecure: boolean;
}

export function checkScheme(url: URL, policy: SchemePolicy): void {
  if (url.protocol === "https:") return;
  if (url.protocol === "http:" && (isLoopback(url.hostname) || policy.insecure)) return;
  throw new ForkdError(
    "invalid_argument",
    `refusing ${url.protocol.replace(":", "")}://${url.host}: only https, or http on loopback or with --insecure`,
    { url: url.origin },
  );
}

/** Aborts `signal` when touch() has not been called for `ms`. */
export class Watchdog {
  private readonly ctl = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  constructor(
    private readonly ms: number,
    readonly what: string,
  ) {
    this.touch();
  }
  get signal(): AbortSignal {
    return this.ctl.signal;
  }
  touch(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(
      () => this.ctl.abort(new ForkdError("timeout", `${this.what}: no progress for ${this.ms / 1000} s`)),
      this.ms,
    );
  }
  abort(e: Error): void {
    clearTimeout(this.timer);
    this.ctl.abort(e);
  }
  clear(): void {
    clearTimeout(this.timer);
  }
}

export interface RequestBody {
  data: Buffer | Readable;
  length: number;
  type?: string;
}

export interface SendOptions {
  method: string;
  headers?: Record<string, string>;
  /** Made afresh for each attempt (a retry after an auth challenge sends it again). */
  body?: () => RequestBody;
  policy: SchemePolicy;
  idleMs: number;
  what: string;
}

export interface Sent {
  res: Response;
  /** The URL that answered (after redirects). */
  url: URL;
  watchdog: Watchdog;
}

const MAX_REDIRECTS = 5;

/** Touches the watchdog on every chunk that passes. */
const touching = (w: Watchdog) =>
  new Transform({
    transform(chunk: Buffer, _enc, cb) {
      w.touch();
      cb(null, chunk);
    },
  });

/**
 * One request, redirects followed. The caller reads (or cancels) the body and clears the
 * watchdog: see `readLimited` and `bodyStream`.
 */
export async function send(url: URL, o: SendOptions): Promise<Sent> {
  const watchdog = new Watchdog(o.idleMs, o.what);
  const origin = url.origin;
  let current = url;
  try {
    for (let hop = 0; ; hop++) {
      checkScheme(current, o.policy);
      const headers: Record<string, string> = { ...(o.headers ?? {}) };
      if (current.origin !== origin) delete headers.authorization;
      let body: Buffer | ReadableStream<Uint8Array> | undefined;
      let duplex: "half" | undefined;
      // A redirected body-carrying request is not replayed to another host.
      const b = hop === 0 ? o.body?.() : undefined;
      if (b) {
        headers["content-length"] = String(b.length);
        headers["content-type"] = b.type ?? "application/octet-stream";
        if (Buffer.isBuffer(b.data)) body = b.data;
        else {
          const t = touching(watchdog);
          b.data.on("error", (e) => t.destroy(e));
          body = Readable.toWeb(b.data.pipe(t)) as ReadableStream<Uint8Array>;
          duplex = "half";
        }
      }
      const init: RequestInit & { duplex?: "half" } = {
        method: o.method,
        headers,
        redirect: "manual",
        signal: watchdog.signal,
        ...(body !== undefined ? { body } : {}),
        ...(duplex ? { duplex } : {}),
      };
      const res = await fetch(current, init);
      watchdog.touch();
      const loc = res.headers.get("location");
      const redirect = [301, 302, 303, 307, 308].includes(res.status) && loc;
      if (!redirect || (o.method !== "GET" && o.method !== "HEAD")) return { res, url: current, watchdog };
      await res.body?.cancel().catch(() => undefined);
      if (hop >= MAX_REDIRECTS) {
        throw new ForkdError("unavailable", `${o.what}: more than ${MAX_REDIRECTS} redirects`);
      }
      current = new URL(loc, current);
    }
  } catch (e) {
    watchdog.clear();
    if (e instanceof ForkdError) throw e;
    const reason: unknown = watchdog.signal.reason;
    if (watchdog.signal.aborted && reason instanceof ForkdError) throw reason;
    throw new ForkdError("unavailable", `${o.what}: ${describeFetchError(e)}`, {}, e);
  }
}

/** fetch's errors say "fetch failed"; the reason is in the cause. */
export function describeFetchError(e: unknown): string {
  const cause = e instanceof Error ? (e.cause as { code?: string; message?: string } | undefined) : undefined;
  if (cause?.message) return `${cause.code ? `${cause.code}: ` : ""}${cause.message}`;
  return errorMessage(e);
}

/**
 * What a failure while a body was read is reported as: our own error as it is, the watchdog's
 * timeout if it fired, else the peer broke the response off (a connection closed before the
 * declared length, a reset): unavailable.
 */
function bodyFailure(s: Sent, e: unknown): ForkdError {
  if (e instanceof ForkdError) return e;
  const reason: unknown = s.watchdog.signal.reason;
  if (s.watchdog.signal.aborted && reason instanceof ForkdError) return reason;
  return new ForkdError(
    "unavailable",
    `${s.watchdog.what}: the response broke off: ${describeFetchError(e)}`,
    {},
    e,
  );
}

/** Reads a response body of at most `max` bytes (refused before reading when announced larger). */
export async function readLimited(s: Sent, max: number): Promise<Buffer> {
  const declared = Number(s.res.headers.get("content-length") ?? "0");
  try {
    if (declared > max) {
      throw new ForkdError("invalid_argument", `response is larger than ${max} bytes`, { limit: max });
    }
    const parts: Buffer[] = [];
    let size = 0;
    if (s.res.body) {
      for await (const chunk of s.res.body as AsyncIterable<Uint8Array>) {
        s.watchdog.touch();
        size += chunk.length;
        if (size > max) {
          throw new ForkdError("invalid_argument", `response is larger than ${max} bytes`, { limit: max });
        }
        parts.push(Buffer.from(chunk));
      }
    }
    return Buffer.concat(parts);
  } catch (e) {
    const err = bodyFailure(s, e);
    s.watchdog.abort(err);
    throw err;
  } finally {
    s.watchdog.clear();
  }
}

/** Discards a response body. */
export async function discard(s: Sent): Promise<void> {
  await s.res.body?.cancel().catch(() => undefined);
  s.watchdog.clear();
}

/** The body as a Node stream that keeps the watchdog fed; destroying it aborts the request. */
export function bodyStream(s: Sent): Readable {
  if (!s.res.body) {
    s.watchdog.clear();
    return Readable.from([]);
  }
  const src = Readable.fromWeb(s.res.body as WebReadable<Uint8Array>);
  const out = src.pipe(touching(s.watchdog));
  src.on("error", (e) => out.destroy(bodyFailure(s, e)));
  out.on("close", () => {
    if (!src.readableEnded) {
      s.watchdog.abort(new Error("stream closed"));
      src.destroy();
    }
    s.watchdog.clear();
  });
  return out;
}
