/**
 * A code interpreter failure before its reply started, as E2B's SDKs read it: the status of the
 * error's code (404 is their NotFoundError) and the message as the plain-text body.
 */
import { statusOf } from "../../util/index.js";
import { ForkdError } from "../../util/index.js";
import type { NdjsonReply } from "./ndjson-reply.js";

export function sendError(reply: NdjsonReply, e: unknown): void {
  if (e instanceof ForkdError) reply.fail(statusOf(e.code), e.message);
  else reply.fail(500, "internal error");
}
