/**
 * HTTP for registries and pack URLs, over Node's http and https modules: a scheme policy checked
 * on every hop (https, or plain http only where allowed), for a tenant's request the addresses it
 * may connect to (reach.ts: checked on every hop, at connection time), redirects followed by
 * hand (at most 5, the Authorization header dropped when the origin changes), and an idle
 * timeout that aborts a request making no progress (headers, or a body chunk in either
 * direction). Replies are fetch's Response (status, headers, a web stream body); no content
 * encoding is asked for, so bodies arrive as the server stores them.
 */
import { request as httpRequest } from "node:http";
import type { IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import type { RequestOptions } from "node:https";
import type { LookupFunction } from "node:net";
import type { SecureContext } from "node:tls";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as WebReadable } from "node:stream/web";
import { ForkdError, errorMessage } from "../util/index.js";
import { VERSION } from "../host/index.js";
import { connectCheck } from "./reach.js";
import type { TenantGuard } from "./reach.js";
import { isLoopback } from "./ref.js";

export interface SchemePolicy {
  /** Plain http to non-loopback hosts (the user said --insecure, or listed the host). */
  insecure: boolean;
  /** A tenant's request: only the addresses this guard admits (absent: the operator's, any). */
  tenant?: TenantGuard;
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
  /** The CAs an https server's certificate must chain to (absent: Node's; a cluster's peers). */
  trust?: SecureContext;
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

/** Statuses whose reply has no body (fetch's Response refuses one). */
const NULL_BODY = new Set([204, 205, 304]);

/**
 * One HTTP exchange: the request (its body streamed or whole) and the reply's head, as a
 * Response whose body streams the rest. Errors before the head reject; after it they error the
 * body.
 */
function exchange(
  url: URL,
  o: {
    method: string;
    headers: Record<string, string>;
    body: Buffer | Readable | undefined;
    signal: AbortSignal;
    lookup: LookupFunction | undefined;
    trust: SecureContext | undefined;
  },
): Promise<Response> {
  return new Promise<Response>((resolve, reject) => {
    const options: RequestOptions = {
      method: o.method,
      headers: o.headers,
      signal: o.signal,
      // No pooled connection: each is made (and its address checked) for its request.
      agent: false,
      ...(o.lookup ? { lookup: o.lookup } : {}),
      ...(o.trust && url.protocol === "https:" ? { secureContext: o.trust } : {}),
    };
    const onReply = (im: IncomingMessage) => {
      try {
        const status = im.statusCode ?? 0;
        const headers = new Headers();
        for (let i = 0; i + 1 < im.rawHeaders.length; i += 2) {
          headers.append(im.rawHeaders[i] ?? "", im.rawHeaders[i + 1] ?? "");
        }
        const empty = o.method === "HEAD" || NULL_BODY.has(status);
        if (empty) im.resume();
        resolve(
          new Response(empty ? null : (Readable.toWeb(im) as ReadableStream<Uint8Array>), {
            status,
            headers,
          }),
        );
      } catch (e) {
        im.destroy();
        reject(new ForkdError("unavailable", `a malformed reply: ${errorMessage(e)}`, {}, e));
      }
    };
    let req;
    try {
      req = (url.protocol === "https:" ? httpsRequest : httpRequest)(url, options, onReply);
    } catch (e) {
      reject(e instanceof Error ? e : new Error(String(e)));
      return;
    }
    req.on("error", reject); // after the head: a no-op (the body stream reports it)
    if (o.body === undefined) req.end();
    else if (Buffer.isBuffer(o.body)) req.end(o.body);
    else pipeline(o.body, req).catch((e: unknown) => req.destroy(e instanceof Error ? e : undefined));
  });
}

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
      const lookup = o.policy.tenant ? connectCheck(current, o.policy.tenant, o.what) : undefined;
      const headers: Record<string, string> = {
        "user-agent": `forkd/${VERSION}`,
        accept: "*/*",
        ...(o.headers ?? {}),
      };
      if (current.origin !== origin) delete headers.authorization;
      let body: Buffer | Readable | undefined;
      // A redirected body-carrying request is not replayed to another host.
      const b = hop === 0 ? o.body?.() : undefined;
      if (b) {
        headers["content-length"] = String(b.length);
        headers["content-type"] = b.type ?? "application/octet-stream";
        if (Buffer.isBuffer(b.data)) body = b.data;
        else {
          const t = touching(watchdog);
          b.data.on("error", (e) => t.destroy(e));
          body = b.data.pipe(t);
        }
      }
      const res = await exchange(current, {
        method: o.method,
        headers,
        body,
        signal: watchdog.signal,
        lookup,
        trust: o.trust,
      });
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

/** A connection's error as a sentence (fetch's "fetch failed" carries the reason in its cause). */
export function describeFetchError(e: unknown): string {
  const cause = e instanceof Error ? (e.cause as { code?: string; message?: string } | undefined) : undefined;
  if (cause?.message) return `${cause.code ? `${cause.code}: ` : ""}${cause.message}`;
  const code = (e as NodeJS.ErrnoException | undefined)?.code;
  const msg = errorMessage(e);
  return code && !msg.includes(code) ? `${code}: ${msg}` : msg;
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
