/**
 * EVAL: a cell run by one of the guest's warm kernels (guest/evalsrv: python, javascript), and the
 * validation of the JSON it answers with (it comes from the guest). A kernel the image cannot run
 * (no interpreter, no kernel source) is `unavailable`.
 */
import { ForkdError } from "../util/errors.js";
import { Msg, Tag, field } from "./codec.js";
import type { Field, FieldInput } from "./codec.js";
import { DEFAULT_TIMEOUT_MS } from "./connection.js";
import type { AgentConnection } from "./connection.js";

/** One rich output: MIME type to data (text, or base64 for images; JSON for application/json). */
export type MimeBundle = Record<string, unknown>;

export interface EvalResult {
  ok: boolean;
  value: string | null;
  /** Rich forms of the value (text/html, image/png, ...), if it has any. */
  value_data: MimeBundle | null;
  /** display()ed objects and figures the cell left open, in order. */
  display: MimeBundle[];
  stdout: string;
  stderr: string;
  error: { name: string; value: string; traceback: string } | null;
}

/** The kernels an EVAL can name. */
export const EVAL_LANGUAGES = ["python", "javascript"] as const;
export type EvalLanguage = (typeof EVAL_LANGUAGES)[number];

/** The guest interrupts the cell at its timeout; it has this long more to answer. */
const EVAL_GRACE_MS = 5_000;
/** The guest's errno for a kernel the image cannot run. */
const ENOENT = 2;

/** Runs a cell. Python is not named on the wire (an agent older than kernels has only it). */
export async function evalCode(
  conn: AgentConnection,
  code: string,
  timeoutMs = DEFAULT_TIMEOUT_MS,
  language: EvalLanguage = "python",
): Promise<EvalResult> {
  const fields: FieldInput[] = [
    [Tag.CODE, code],
    [Tag.TIMEOUT_MS, timeoutMs],
  ];
  if (language !== "python") fields.push([Tag.LANGUAGE, language]);
  let f: Field[];
  try {
    f = await conn.request(Msg.EVAL, fields, timeoutMs + EVAL_GRACE_MS);
  } catch (e) {
    // ENOENT is only ever the guest saying it has no such kernel (its message names what is missing)
    if (e instanceof ForkdError && e.details.errno === ENOENT) {
      throw new ForkdError("unavailable", e.message, { ...e.details, language });
    }
    throw e;
  }
  const json = field(f, Tag.JSON);
  if (!json) throw new ForkdError("agent_protocol", "eval reply without JSON");
  return parseEvalJson(json);
}

const MIME_RE = /^[a-z]+\/[A-Za-z0-9.+-]{1,100}$/;

/** A guest-sent MIME bundle, keeping only well-formed entries (strings; any JSON for JSON types). */
function mimeBundle(v: unknown): MimeBundle | null {
  if (typeof v !== "object" || v === null || Array.isArray(v)) return null;
  const out: MimeBundle = {};
  for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
    if (!MIME_RE.test(k)) continue;
    if (typeof x === "string" || k.endsWith("json")) out[k] = x;
  }
  return Object.keys(out).length > 0 ? out : null;
}

/** Validates the interpreter's JSON: it comes from the guest. */
export function parseEvalJson(buf: Buffer): EvalResult {
  let v: unknown;
  try {
    v = JSON.parse(buf.toString("utf8"));
  } catch {
    throw new ForkdError("agent_protocol", "eval reply is not JSON");
  }
  const o = v as Record<string, unknown>;
  const str = (x: unknown) => (typeof x === "string" ? x : "");
  if (typeof o !== "object" || o === null || typeof o.ok !== "boolean") {
    throw new ForkdError("agent_protocol", "eval reply has the wrong shape");
  }
  const err = o.error as Record<string, unknown> | null | undefined;
  return {
    ok: o.ok,
    value: typeof o.value === "string" ? o.value : null,
    value_data: mimeBundle(o.value_data),
    display: Array.isArray(o.display)
      ? o.display.map(mimeBundle).filter((b): b is MimeBundle => b !== null)
      : [],
    stdout: str(o.stdout),
    stderr: str(o.stderr),
    error:
      err && typeof err === "object"
        ? { name: str(err.name), value: str(err.value), traceback: str(err.traceback) }
        : null,
  };
}
