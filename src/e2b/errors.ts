/**
 * E2B's errors on a daemon's E2B doors, both planes (the shape, `{"code": <HTTP status>,
 * "message"}`, is src/http/e2b-error.ts, which a gateway answers with too): a tenant's message
 * names nothing of the host's file system.
 */
import type { ServerResponse } from "node:http";
import type { Caller } from "../access/index.js";
import { isAdmin } from "../access/index.js";
import { redactHostPaths } from "../app/index.js";
import type { HostDirs } from "../app/index.js";
import { e2bErrorReply, sendJson } from "../http/index.js";
import type { E2bErrorReply } from "../http/index.js";

/** The status, body and headers of `e` as E2B answers errors, to `caller` (absent: as to an admin). */
export function e2bError(e: unknown, caller?: Caller, dirs?: HostDirs): E2bErrorReply {
  return e2bErrorReply(
    e,
    caller && !isAdmin(caller) && dirs ? (m: string) => redactHostPaths(m, dirs) : undefined,
  );
}

/** Writes the error reply on a raw response (one already started is cut instead). */
export function sendE2bError(res: ServerResponse, e: unknown, caller?: Caller, dirs?: HostDirs): void {
  const r = e2bError(e, caller, dirs);
  sendJson(res, r.status, r.body, r.headers);
}
