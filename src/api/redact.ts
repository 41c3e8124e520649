/**
 * The REST API's replies as a tenant sees them: its error envelope and NDJSON streams with host
 * paths replaced (src/app/redact.ts says what is replaced, and how).
 */
import { redactHostPaths } from "../app/index.js";
import type { HostDirs } from "../app/index.js";
import type { z } from "zod";
import type { ErrorEnvelope as ErrorEnvelopeSchema } from "./contract/schemas.js";

type ErrorEnvelope = z.infer<typeof ErrorEnvelopeSchema>;

function redactValue(v: unknown, dirs: HostDirs, depth = 0): unknown {
  if (typeof v === "string") return redactHostPaths(v, dirs);
  if (depth > 4 || v === null || typeof v !== "object") return v;
  if (Array.isArray(v)) return v.map((x) => redactValue(x, dirs, depth + 1));
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, redactValue(x, dirs, depth + 1)]));
}

/** The envelope with host paths replaced in its message and details. */
export function redactEnvelope(env: ErrorEnvelope, dirs: HostDirs): ErrorEnvelope {
  return {
    error: {
      code: env.error.code,
      message: redactHostPaths(env.error.message, dirs),
      details: redactValue(env.error.details, dirs) as Record<string, unknown>,
    },
  };
}

/** NDJSON events whose strings are messages (the rest, command output, passes untouched). */
const MESSAGE_EVENTS = ['{"type":"error"', '{"type":"progress"'].map((p) => Buffer.from(p));

/**
 * A tenant's NDJSON reply with host paths replaced in its error and progress events. Lines are
 * told apart by their first bytes: an output line streams through as it comes (never held
 * whole), a message line is held to its end, rewritten and sent on.
 */
export function redactNdjson(dirs: HostDirs): TransformStream<Uint8Array, Uint8Array> {
  let mode: "start" | "pass" | "hold" = "start";
  let held: Buffer[] = [];
  const decide = (head: Buffer): "pass" | "hold" | "undecided" => {
    for (const p of MESSAGE_EVENTS) {
      const n = Math.min(head.length, p.length);
      if (head.subarray(0, n).equals(p.subarray(0, n))) return n === p.length ? "hold" : "undecided";
    }
    return "pass";
  };
  const rewrite = (line: Buffer): Buffer => {
    const nl = line[line.length - 1] === 10 ? "\n" : "";
    try {
      const ev = JSON.parse(line.toString("utf8")) as unknown;
      return Buffer.from(JSON.stringify(redactValue(ev, dirs)) + nl);
    } catch {
      return line;
    }
  };
  const take = () => {
    const b = Buffer.concat(held);
    held = [];
    return b;
  };
  return new TransformStream<Uint8Array, Uint8Array>({
    transform(chunk, controller) {
      const buf = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      const out: Buffer[] = [];
      for (let i = 0; i < buf.length;) {
        const nl = buf.indexOf(10, i);
        const end = nl < 0 ? buf.length : nl + 1;
        const piece = buf.subarray(i, end);
        i = end;
        if (mode === "pass") out.push(piece);
        else {
          held.push(piece);
          if (mode === "start") {
            const d = decide(Buffer.concat(held));
            if (d === "pass") {
              out.push(take());
              mode = "pass";
            } else if (d === "hold") mode = "hold";
          }
          if (nl >= 0 && mode !== "pass") out.push(mode === "hold" ? rewrite(take()) : take());
        }
        if (nl >= 0) mode = "start";
      }
      if (out.length > 0) controller.enqueue(out.length === 1 ? out[0]! : Buffer.concat(out));
    },
    flush(controller) {
      if (held.length > 0) controller.enqueue(mode === "hold" ? rewrite(take()) : take());
    },
  });
}
