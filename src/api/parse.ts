/**
 * Request parsing at the edge: JSON bodies and queries through the schemas, or a 400. Bodies are
 * read within their route's bound (set by the edge from BodyLimits), also when the client sent
 * no length: past it, a 413.
 */
import type { Context } from "hono";
import type { z } from "zod";
import { ForkdError, errorMessage } from "../util/index.js";
import type { ApiContext } from "./env.js";
import { DEFAULT_BODY_LIMITS, tooLarge } from "../app/index.js";

function invalid(err: z.ZodError, where: string): ForkdError {
  return new ForkdError(
    "invalid_argument",
    `invalid ${where}: ${err.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")}`,
    {
      issues: err.issues.map((i) => ({ path: i.path.map(String), message: i.message })),
    },
  );
}

export async function parseBody<S extends z.ZodType>(c: ApiContext, schema: S): Promise<z.infer<S>> {
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(await readBytes(c));
  } catch (e) {
    if (e instanceof ForkdError) throw e;
    throw new ForkdError("invalid_argument", "unreadable request body (not UTF-8?)", {}, e);
  }
  let json: unknown;
  try {
    json = text.length === 0 ? {} : JSON.parse(text);
  } catch {
    throw new ForkdError("invalid_argument", "request body is not valid JSON");
  }
  const r = schema.safeParse(json);
  if (!r.success) throw invalid(r.error, "request body");
  return r.data;
}

export function parseQuery<S extends z.ZodType>(c: Context, schema: S): z.infer<S> {
  const r = schema.safeParse(c.req.query());
  if (!r.success) throw invalid(r.error, "query");
  return r.data;
}

export function parseParams<S extends z.ZodType>(c: Context, schema: S): z.infer<S> {
  const r = schema.safeParse(c.req.param());
  if (!r.success) throw invalid(r.error, "path");
  return r.data;
}

/** The request body's bound for this route (the edge sets it; JSON's when called without it). */
const limitOf = (c: ApiContext): number => c.get("bodyLimit") ?? DEFAULT_BODY_LIMITS.json;

/** The raw request body, at most its route's bound. */
export async function readBytes(c: ApiContext): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  for await (const chunk of bodyStream(c) ?? []) parts.push(chunk);
  return Buffer.concat(parts);
}

/** The request body as a stream that fails with a 413 once past its route's bound (null: none). */
export function bodyStream(c: ApiContext): AsyncIterable<Uint8Array> | null {
  const max = limitOf(c);
  const len = Number(c.req.header("content-length") ?? "0");
  if (len > max) throw tooLarge(max);
  const body = c.req.raw.body;
  if (!body) return null;
  return (async function* () {
    let size = 0;
    try {
      for await (const chunk of body as AsyncIterable<Uint8Array>) {
        size += chunk.length;
        if (size > max) throw tooLarge(max);
        yield chunk;
      }
    } catch (e) {
      if (e instanceof ForkdError) throw e;
      // The connection broke mid-body (the client hung up): the request's fault, not ours.
      throw new ForkdError("invalid_argument", `the request body was cut short: ${errorMessage(e)}`);
    }
  })();
}
