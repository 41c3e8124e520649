/**
 * E2B's error shape, `{"code": <HTTP status>, "message"}` (its openapi's Error), for both planes:
 * forkd's errors keep their HTTP status (src/util/error-status.ts) and, for a tenant, a message that names
 * nothing of the host's file system.
 */
import type { ServerResponse } from "node:http";
import type { Caller } from "../access/index.js";
import { isAdmin } from "../access/index.js";
import { statusOf } from "../util/index.js";
import { redactHostPaths } from "../app/index.js";
import type { HostDirs } from "../app/index.js";
import { ForkdError } from "../util/index.js";

export interface E2bErrorBody {
  code: number;
  message: string;
}

/** The status and body of `e` as E2B answers errors. */
export function e2bError(
  e: unknown,
  caller?: Caller,
  dirs?: HostDirs,
): { status: number; body: E2bErrorBody } {
  if (!(e instanceof ForkdError)) return { status: 500, body: { code: 500, message: "internal error" } };
  const status = statusOf(e.code);
  const message = caller && !isAdmin(caller) && dirs ? redactHostPaths(e.message, dirs) : e.message;
  return { status, body: { code: status, message } };
}

/** Writes the error reply on a raw response (nothing is written if headers went out already). */
export function sendE2bError(res: ServerResponse, e: unknown, caller?: Caller, dirs?: HostDirs): void {
  const { status, body } = e2bError(e, caller, dirs);
  sendJson(res, status, body);
}

/** A whole JSON reply on a raw response; a reply already started is ended instead. */
export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(text)),
    ...headers,
  });
  res.end(text);
}
