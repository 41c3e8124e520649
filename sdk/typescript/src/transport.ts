/**
 * HTTP to the forkd daemon: over its unix socket by default, or a URL (http/https) with a bearer
 * token. Node's own http module only: the SDK has no runtime dependencies.
 */
import { request as httpRequest } from "node:http";
import type { ClientRequest, IncomingMessage, RequestOptions } from "node:http";
import { request as httpsRequest } from "node:https";
import { Readable } from "node:stream";
import { ConnectionError, ForkdError, TimeoutError, errorFromEnvelope } from "./errors.js";

export interface ConnectionOpts {
  /** Daemon URL, e.g. http://10.0.0.5:8889 (default: $FORKD_URL, else the unix socket). */
  url?: string;
  /** Bearer token for a URL (default: $FORKD_TOKEN). */
  token?: string;
  /** E2B's name for `token`. */
  apiKey?: string;
  /** Unix socket (default: $FORKD_SOCKET, else /var/lib/forkd/forkd.sock). */
  socket?: string;
  /** Timeout of each API request in ms (default 60 000; 0 = none). Long operations take their own. */
  requestTimeoutMs?: number;
  /** Extra CA certificate(s) (PEM) trusted for an https URL, e.g. a self-signed daemon's. */
  ca?: string | Buffer;
}

export const DEFAULT_SOCKET = "/var/lib/forkd/forkd.sock";

export type Query = Record<string, string | number | boolean | undefined>;

export interface RequestOpts {
  query?: Query;
  json?: unknown;
  /** Raw request body (bytes or a stream of bytes). */
  body?: Uint8Array | NodeJS.ReadableStream;
  /**
   * An idle timeout (0: none): the request fails with TimeoutError once no byte has been sent or
   * received for this long, while its body is sent and while its reply (a stream included) is
   * read, so a long stream that keeps flowing is never cut and a stalled one always is.
   */
  timeoutMs?: number;
  /** Aborting it cuts the request and its reply (both fail with an AbortError). */
  signal?: AbortSignal;
  /** Extra request headers (e.g. content-encoding). */
  headers?: Record<string, string>;
}

export class Transport {
  readonly url: URL | null;
  readonly socket: string;
  private readonly token: string | undefined;
  private readonly ca: string | Buffer | undefined;
  readonly timeoutMs: number;

  constructor(opts: ConnectionOpts = {}) {
    const env = process.env;
    const url = opts.url ?? env.FORKD_URL;
    this.url = url ? new URL(url) : null;
    this.socket = opts.socket ?? env.FORKD_SOCKET ?? DEFAULT_SOCKET;
    this.token = opts.token ?? opts.apiKey ?? env.FORKD_TOKEN;
    this.timeoutMs = opts.requestTimeoutMs ?? 60_000;
    this.ca = opts.ca;
  }

  /** The daemon's base URL (http+unix://<socket> on the unix socket). */
  get baseUrl(): string {
    if (!this.url) return `http+unix://${encodeURIComponent(this.socket)}`;
    return this.url.origin + this.url.pathname.replace(/\/$/, "");
  }

  /** Where requests go, for messages. */
  get where(): string {
    return this.url ? this.url.origin : `unix:${this.socket}`;
  }

  /** Sends a request and returns the response once its status is 2xx (else throws the typed error). */
  async send(method: string, path: string, o: RequestOpts = {}): Promise<IncomingMessage> {
    let full = path;
    if (o.query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(o.query)) if (v !== undefined) q.set(k, String(v));
      const s = q.toString();
      if (s) full += `?${s}`;
    }
    const headers: Record<string, string> = { ...o.headers };
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    let payload: Uint8Array | NodeJS.ReadableStream | undefined = o.body;
    if (o.json !== undefined) {
      payload = Buffer.from(JSON.stringify(o.json), "utf8");
      headers["content-type"] = "application/json";
    } else if (o.body !== undefined) {
      headers["content-type"] = "application/octet-stream";
    }
    if (payload instanceof Uint8Array) headers["content-length"] = String(payload.length);

    const timeoutMs = o.timeoutMs ?? this.timeoutMs;
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const base: RequestOptions = { method, path: full, headers };
      const req = this.url
        ? this.url.protocol === "https:"
          ? httpsRequest({ ...this.#tcp(base, full), ...(this.ca ? { ca: this.ca } : {}) })
          : httpRequest(this.#tcp(base, full))
        : httpRequest({ ...base, socketPath: this.socket });
      // Once the reply has begun, a timeout or an abort ends it too, with that error (not a bare
      // "aborted"), so whoever reads it learns why.
      let reply: IncomingMessage | null = null;
      req.once("response", (r: IncomingMessage) => {
        reply = r;
        resolve(r);
      });
      if (o.signal) watchAbort(o.signal, req, () => reply);
      let bodyError: unknown = null;
      req.on("error", (e: NodeJS.ErrnoException) => {
        if (e instanceof ForkdError || e === bodyError) reject(e);
        else if (e.name === "AbortError") reject(e);
        else
          reject(
            new ConnectionError(`cannot reach the forkd daemon at ${this.where}: ${e.message}`, {
              code: "connection",
              cause: e,
            }),
          );
      });
      if (timeoutMs > 0) {
        req.setTimeout(timeoutMs, () => {
          const e = new TimeoutError(`${method} ${path}: nothing sent or received for ${timeoutMs} ms`, {
            code: "timeout",
          });
          req.destroy(e);
          reply?.destroy(e);
        });
      }
      if (payload === undefined) req.end();
      else if (payload instanceof Uint8Array) req.end(payload);
      else {
        const body = Readable.from(payload as AsyncIterable<Uint8Array>);
        body.once("error", (e) => {
          bodyError = e; // the caller's stream failed (e.g. a file that cannot be read)
          req.destroy(e);
        });
        body.pipe(req);
      }
    });
    const status = res.statusCode ?? 0;
    if (status >= 200 && status < 300) return res;
    const text = (await readAll(res)).toString("utf8");
    let env: { error?: { code?: string; message?: string; details?: Record<string, unknown> } } = {};
    try {
      env = JSON.parse(text) as typeof env;
    } catch {
      /* not an envelope */
    }
    throw errorFromEnvelope(
      status,
      env.error?.code ?? "internal",
      env.error?.message ?? (text || `HTTP ${status}`),
      env.error?.details ?? {},
    );
  }

  #tcp(base: RequestOptions, full: string): RequestOptions {
    const url = this.url as URL;
    return {
      ...base,
      host: url.hostname,
      port: url.port || undefined,
      path: url.pathname.replace(/\/$/, "") + full,
    };
  }

  async json<T>(method: string, path: string, o: RequestOpts = {}): Promise<T> {
    const res = await this.send(method, path, o);
    return JSON.parse((await readAll(res)).toString("utf8")) as T;
  }

  async bytes(method: string, path: string, o: RequestOpts = {}): Promise<Buffer> {
    return readAll(await this.send(method, path, o));
  }

  /** Calls `onEvent` for each line of an NDJSON reply, as it arrives. */
  async ndjson<T>(
    method: string,
    path: string,
    onEvent: (ev: T) => void,
    o: RequestOpts = {},
  ): Promise<void> {
    const res = await this.send(method, path, { timeoutMs: 0, ...o });
    res.setEncoding("utf8"); // a character split across two chunks is decoded whole
    let buf = "";
    try {
      for await (const chunk of res) {
        buf += chunk as string;
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (line.trim()) onEvent(JSON.parse(line) as T);
        }
      }
    } catch (e) {
      throw cutReply(e);
    }
    if (buf.trim() !== "") throw cutReply(new Error("the reply ended inside a line"));
  }
}

/**
 * What a reply that stopped early is to the caller: our own timeout or abort as they are; else
 * the daemon (or the network) closed the connection mid-reply, a ConnectionError.
 */
function cutReply(e: unknown): unknown {
  if (e instanceof ForkdError || (e instanceof Error && e.name === "AbortError") || e instanceof SyntaxError)
    return e;
  const why = e instanceof Error ? e.message : String(e);
  return new ConnectionError(`the forkd daemon closed the connection mid-reply: ${why}`, {
    code: "connection",
    cause: e,
  });
}

/**
 * Cuts `req`, and its reply once there is one, when `signal` aborts: one listener for the whole
 * call, removed when the call is over (request and reply closed), so a signal shared by many
 * calls, or kept after them, gathers no listeners (Node warns past 10: MaxListenersExceeded).
 */
function watchAbort(signal: AbortSignal, req: ClientRequest, reply: () => IncomingMessage | null): void {
  const onAbort = () => {
    const e = abortError();
    req.destroy(e);
    reply()?.destroy(e);
  };
  if (signal.aborted) return onAbort();
  signal.addEventListener("abort", onAbort, { once: true });
  let open = 1;
  const closed = () => {
    if (--open === 0) signal.removeEventListener("abort", onAbort);
  };
  req.once("response", (r: IncomingMessage) => {
    open++;
    r.once("close", closed);
  });
  req.once("close", closed);
}

function abortError(): Error {
  const e = new Error("the request was aborted");
  e.name = "AbortError";
  return e;
}

export async function readAll(res: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  try {
    for await (const c of res) chunks.push(c as Buffer);
  } catch (e) {
    throw cutReply(e);
  }
  return Buffer.concat(chunks);
}
