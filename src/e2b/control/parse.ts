/**
 * Reading E2B's JSON bodies and queries through their schemas (schemas.ts): at most the daemon's
 * JSON body bound (past it, a 413, also without a length), else a 400 naming the field.
 */
import type { z } from "zod";
import { tooLarge } from "../../app/index.js";
import { ForkdError, errorMessage } from "../../util/index.js";
import type { E2bApiContext } from "./env.js";

function invalid(err: z.ZodError, where: string): ForkdError {
  return new ForkdError(
    "invalid_argument",
    `invalid ${where}: ${err.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")}`,
  );
}

/** The JSON body (an empty one is `{}`), checked by `schema`. */
export async function readJson<S extends z.ZodType>(
  c: E2bApiContext,
  schema: S,
  max: number,
): Promise<z.infer<S>> {
  if (Number(c.req.header("content-length") ?? "0") > max) throw tooLarge(max);
  const parts: Uint8Array[] = [];
  let size = 0;
  const body = c.req.raw.body;
  if (body) {
    try {
      for await (const chunk of body as AsyncIterable<Uint8Array>) {
        size += chunk.length;
        if (size > max) throw tooLarge(max);
        parts.push(chunk);
      }
    } catch (e) {
      if (e instanceof ForkdError) throw e;
      throw new ForkdError("invalid_argument", `the request body was cut short: ${errorMessage(e)}`);
    }
  }
  let json: unknown = {};
  const text = Buffer.concat(parts).toString("utf8");
  if (text.trim().length > 0) {
    try {
      json = JSON.parse(text);
    } catch {
      throw new ForkdError("invalid_argument", "request body is not valid JSON");
    }
  }
  const r = schema.safeParse(json);
  if (!r.success) throw invalid(r.error, "request body");
  return r.data;
}

export function readQuery<S extends z.ZodType>(c: E2bApiContext, schema: S): z.infer<S> {
  const r = schema.safeParse(c.req.query());
  if (!r.success) throw invalid(r.error, "query");
  return r.data;
}
