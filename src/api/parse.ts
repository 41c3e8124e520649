/** Request parsing at the edge: JSON bodies and queries through the schemas, or a 400. */
import type { Context } from "hono";
import type { z } from "zod";
import { ForkdError } from "../util/errors.js";

const MAX_JSON = 32 << 20;

function invalid(err: z.ZodError, where: string): ForkdError {
  return new ForkdError(
    "invalid_argument",
    `invalid ${where}: ${err.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")}`,
    {
      issues: err.issues.map((i) => ({ path: i.path.map(String), message: i.message })),
    },
  );
}

export async function parseBody<S extends z.ZodType>(c: Context, schema: S): Promise<z.infer<S>> {
  const len = Number(c.req.header("content-length") ?? "0");
  if (len > MAX_JSON) throw new ForkdError("invalid_argument", `request body larger than ${MAX_JSON} bytes`);
  let text: string;
  try {
    text = await c.req.text();
  } catch (e) {
    throw new ForkdError("invalid_argument", "unreadable request body", {}, e);
  }
  if (text.length > MAX_JSON)
    throw new ForkdError("invalid_argument", `request body larger than ${MAX_JSON} bytes`);
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

/** A raw request body of at most `max` bytes. */
export async function readBytes(c: Context, max: number): Promise<Uint8Array> {
  const len = Number(c.req.header("content-length") ?? "0");
  if (len > max) throw new ForkdError("invalid_argument", `request body larger than ${max} bytes`);
  const body = c.req.raw.body;
  if (!body) return new Uint8Array(0);
  const parts: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of body as AsyncIterable<Uint8Array>) {
    size += chunk.length;
    if (size > max) throw new ForkdError("invalid_argument", `request body larger than ${max} bytes`);
    parts.push(chunk);
  }
  return Buffer.concat(parts);
}
