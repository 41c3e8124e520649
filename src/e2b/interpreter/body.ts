/**
 * Request bodies of the code interpreter's routes: read with a bound, parsed as JSON, checked by
 * a schema; anything else is invalid_argument (400) or payload_too_large (413).
 */
import type { IncomingMessage } from "node:http";
import type { z } from "zod";
import { ForkdError } from "../../util/index.js";

/** Reads at most `max` bytes; an empty body is `{}`. */
export async function readJsonBody<T extends z.ZodTypeAny>(
  req: IncomingMessage,
  schema: T,
  max: number,
): Promise<z.infer<T>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req as AsyncIterable<Buffer>) {
    size += c.length;
    if (size > max) {
      req.resume();
      throw new ForkdError("payload_too_large", `the body is over ${max} bytes`);
    }
    chunks.push(c);
  }
  const text = Buffer.concat(chunks).toString("utf8");
  let v: unknown = {};
  if (text.trim() !== "") {
    try {
      v = JSON.parse(text);
    } catch {
      throw new ForkdError("invalid_argument", "the body is not JSON");
    }
  }
  const r = schema.safeParse(v);
  if (!r.success) {
    const issue = r.error.issues[0];
    const where = issue && issue.path.length > 0 ? `${issue.path.join(".")}: ` : "";
    throw new ForkdError("invalid_argument", `invalid body: ${where}${issue?.message ?? "wrong shape"}`);
  }
  return r.data;
}
