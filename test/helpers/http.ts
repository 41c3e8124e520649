/**
 * A raw HTTP client for tests and benchmarks: the requests the SDK would never send (hostile
 * bodies, hang-ups at a chosen byte, bare status codes). Every client of the product — the
 * CLI, the MCP server, programs — goes through the SDK instead.
 */
import { request as httpRequest } from "node:http";
import type { IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";

export interface Endpoint {
  socket?: string;
  /** http://HOST:PORT or https://HOST:PORT */
  url?: string;
  token?: string;
  /** Extra CA certificate(s) (PEM) trusted for an https URL, e.g. a self-signed daemon's. */
  ca?: string | Buffer;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/**
 * One request. `timeoutMs` is an idle timeout (0: none): the request fails once no byte has been
 * sent or received for that long, while sending its body and while reading the reply (a stream
 * included), so a long stream that keeps flowing is never cut, and a stalled one always is.
 */
export function rawRequest(
  ep: Endpoint,
  method: string,
  path: string,
  body?: Buffer | string | NodeJS.ReadableStream,
  timeoutMs = 0,
  headers: Record<string, string> = {},
  /** Aborting it cuts the request and its reply (both reads fail with an AbortError). */
  signal?: AbortSignal,
): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const h: Record<string, string> = { ...headers };
    if (ep.token) h.authorization = `Bearer ${ep.token}`;
    const base = ep.url ? new URL(ep.url) : null;
    const common = { path, method, headers: h, ...(signal ? { signal } : {}) };
    const req = !base
      ? httpRequest({ socketPath: ep.socket, ...common }, resolve)
      : base.protocol === "https:"
        ? httpsRequest(
            { host: base.hostname, port: base.port, ...common, ...(ep.ca ? { ca: ep.ca } : {}) },
            resolve,
          )
        : httpRequest({ host: base.hostname, port: base.port, ...common }, resolve);
    req.on("error", reject);
    if (timeoutMs > 0) {
      req.setTimeout(timeoutMs, () =>
        req.destroy(new ApiError(0, "timeout", `request timed out after ${timeoutMs} ms`)),
      );
    }
    if (body === undefined) req.end();
    else if (typeof body === "string" || Buffer.isBuffer(body)) req.end(body);
    else body.pipe(req);
  });
}

export async function readAll(res: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** Throws ApiError for a non-2xx response, from the error envelope. */
export async function checkResponse(res: IncomingMessage): Promise<IncomingMessage> {
  const status = res.statusCode ?? 0;
  if (status >= 200 && status < 300) return res;
  const text = (await readAll(res)).toString("utf8");
  try {
    const env = JSON.parse(text) as {
      error?: { code?: string; message?: string; details?: Record<string, unknown> };
    };
    throw new ApiError(
      status,
      env.error?.code ?? "internal",
      env.error?.message ?? text,
      env.error?.details ?? {},
    );
  } catch (e) {
    if (e instanceof ApiError) throw e;
    throw new ApiError(status, "internal", text || `HTTP ${status}`);
  }
}

export async function apiRequest<T = unknown>(
  ep: Endpoint,
  method: string,
  path: string,
  body?: unknown,
  timeoutMs = 0,
): Promise<T> {
  const res = await rawRequest(
    ep,
    method,
    path,
    body === undefined ? undefined : JSON.stringify(body),
    timeoutMs,
    body === undefined ? {} : { "content-type": "application/json" },
  );
  await checkResponse(res);
  return JSON.parse((await readAll(res)).toString("utf8")) as T;
}
