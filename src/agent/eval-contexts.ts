/**
 * Code contexts of the guest's warm kernels: each context is a namespace of its own in a kernel
 * (its globals, execution count and cwd); "default" is the one cells run in when they name none.
 * Created, listed, deleted and restarted by an EVAL whose EVAL_OPTS names the operation (the
 * kernel answers with JSON, validated here: it comes from the guest).
 */
import { ForkdError } from "../util/index.js";
import { Msg, Tag, field } from "./codec.js";
import type { FieldInput } from "./codec.js";
import type { AgentConnection } from "./connection.js";
import type { EvalLanguage } from "./eval.js";

export interface CodeContext {
  id: string;
  language: EvalLanguage;
  cwd: string;
}

export type ContextOp =
  | { op: "create"; cwd?: string }
  | { op: "list" }
  | { op: "delete"; context: string }
  | { op: "restart"; context: string };

const OP_TIMEOUT_MS = 30_000;
/** The guest's errno for a kernel the image cannot run. */
const ENOENT = 2;
/** Context ids the kernels make: "default" or 16 hex digits. */
export const CONTEXT_ID_RE = /^(default|[0-9a-f]{16})$/;

/** Runs a context operation in the kernel of `language`; the contexts it answers with. */
export async function contextOp(
  conn: AgentConnection,
  language: EvalLanguage,
  op: ContextOp,
): Promise<CodeContext[]> {
  const fields: FieldInput[] = [
    [Tag.CODE, ""],
    [Tag.TIMEOUT_MS, OP_TIMEOUT_MS],
    [Tag.EVAL_OPTS, JSON.stringify(op)],
  ];
  if (language !== "python") fields.push([Tag.LANGUAGE, language]);
  let f;
  try {
    f = await conn.request(Msg.EVAL, fields, OP_TIMEOUT_MS + 5_000);
  } catch (e) {
    // ENOENT is only ever the guest saying it has no such kernel (its message names what is missing)
    if (e instanceof ForkdError && e.details.errno === ENOENT) {
      throw new ForkdError("unavailable", e.message, { ...e.details, language });
    }
    throw e;
  }
  const json = field(f, Tag.JSON);
  if (!json) throw new ForkdError("agent_protocol", "context reply without JSON");
  return parseContextReply(json, language, op);
}

/** Validates a kernel's answer to a context operation. */
export function parseContextReply(buf: Buffer, language: EvalLanguage, op: ContextOp): CodeContext[] {
  let v: unknown;
  try {
    v = JSON.parse(buf.toString("utf8"));
  } catch {
    throw new ForkdError("agent_protocol", "context reply is not JSON");
  }
  if (typeof v !== "object" || v === null)
    throw new ForkdError("agent_protocol", "context reply has the wrong shape");
  const o = v as Record<string, unknown>;
  if (o.ok !== true) {
    const err = o.error as Record<string, unknown> | null | undefined;
    const msg = err && typeof err.value === "string" ? err.value.slice(0, 500) : "context operation failed";
    if (o.context_error === "not_found") {
      throw new ForkdError("not_found", `${language} kernel: ${msg}`, { language });
    }
    if (o.context_error === "limit") throw new ForkdError("resource_exhausted", `${language} kernel: ${msg}`);
    if (o.context_error === "invalid") throw new ForkdError("invalid_argument", `${language} kernel: ${msg}`);
    // an agent older than contexts ran the empty code as a cell: it has no context_error
    throw new ForkdError(
      "unavailable",
      "code contexts need a newer guest agent than this sandbox's: make its snapshot again",
      { feature: "code contexts" },
    );
  }
  const raw = op.op === "list" ? o.contexts : [o.context];
  if (!Array.isArray(raw)) {
    throw new ForkdError(
      "unavailable",
      "code contexts need a newer guest agent than this sandbox's: make its snapshot again",
      { feature: "code contexts" },
    );
  }
  return raw.slice(0, 1000).map((c) => {
    const x = c as Record<string, unknown> | null;
    if (!x || typeof x.id !== "string" || !CONTEXT_ID_RE.test(x.id) || typeof x.cwd !== "string") {
      throw new ForkdError("agent_protocol", "context reply has the wrong shape");
    }
    return { id: x.id, language, cwd: x.cwd.slice(0, 4096) };
  });
}
