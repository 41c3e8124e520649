/**
 * The gateway's own replies on a raw response: forkd's error envelope ({"error": {code, message,
 * details}}, the status of its code: src/util/error-status.ts) or E2B's ({code, message}:
 * src/http/e2b-error.ts, a daemon's too), and a request body read whole within a bound (the gateway reads only
 * what it must decide on: a fork's, a login's; everything it relays streams).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { STATUS_CODES } from "node:http";
import type { Duplex } from "node:stream";
import { e2bErrorReply, sendJson } from "../http/index.js";
import { ForkdError, errorMessage, statusOf } from "../util/index.js";

/** forkd's error envelope of `e` (anything not a ForkdError: internal, its message not told). */
export function envelope(e: unknown): { status: number; body: { error: Record<string, unknown> } } {
  if (e instanceof ForkdError)
    return {
      status: statusOf(e.code),
      body: { error: { code: e.code, message: e.message, details: e.details } },
    };
  return { status: 500, body: { error: { code: "internal", message: "internal error", details: {} } } };
}

export function sendError(res: ServerResponse, e: unknown): void {
  const { status, body } = envelope(e);
  const wait = e instanceof ForkdError ? e.details.retry_after_s : undefined;
  sendJson(res, status, body, typeof wait === "number" ? { "retry-after": String(wait) } : {});
}

/** E2B's error reply of `e` (src/http/e2b-error.ts): {code: status, message}. */
export function sendE2bError(res: ServerResponse, e: unknown): void {
  const r = e2bErrorReply(e);
  sendJson(res, r.status, r.body, r.headers);
}

/** The request's body, at most `max` bytes (413 past it), within `ms` (408-like timeout after). */
export function readBody(req: IncomingMessage, max: number, ms = 30_000): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers["content-length"] ?? "0");
    if (declared > max) {
      req.resume();
      return reject(new ForkdError("payload_too_large", `the body is over ${max} bytes`, { limit: max }));
    }
    const parts: Buffer[] = [];
    let got = 0;
    const timer = setTimeout(() => {
      req.destroy();
      reject(new ForkdError("timeout", "the request's body did not come in time"));
    }, ms);
    req.on("data", (c: Buffer) => {
      got += c.length;
      if (got > max) {
        clearTimeout(timer);
        // The rest is read and dropped, so the refusal can still be answered.
        req.removeAllListeners("data");
        req.resume();
        reject(new ForkdError("payload_too_large", `the body is over ${max} bytes`, { limit: max }));
        return;
      }
      parts.push(c);
    });
    req.on("end", () => {
      clearTimeout(timer);
      resolve(Buffer.concat(parts));
    });
    req.on("error", (e) => {
      clearTimeout(timer);
      reject(new ForkdError("invalid_argument", `the request's body broke off: ${errorMessage(e)}`));
    });
  });
}

/** A body read by readBody() as a JSON object (400 otherwise). */
export function jsonObject(raw: Buffer): Record<string, unknown> {
  let v: unknown;
  try {
    v = raw.length === 0 ? {} : JSON.parse(raw.toString("utf8"));
  } catch {
    throw new ForkdError("invalid_argument", "the body is not JSON");
  }
  if (typeof v !== "object" || v === null || Array.isArray(v))
    throw new ForkdError("invalid_argument", "the body must be a JSON object");
  return v as Record<string, unknown>;
}

/** A whole JSON reply on a raw socket (an upgrade refused), then its end. */
export function rawReply(socket: Duplex, status: number, body: unknown): void {
  if (!socket.writable) return void socket.destroy();
  const text = JSON.stringify(body);
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? "Error"}\r\ncontent-type: application/json\r\n` +
      `content-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
  );
}
