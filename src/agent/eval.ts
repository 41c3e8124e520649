/**
 * EVAL: a cell run by one of the guest's warm kernels (guest/evalsrv: python, javascript), and the
 * validation of the JSON it answers with (it comes from the guest). A kernel the image cannot run
 * (no interpreter, no kernel source) is `unavailable`. A cell may name a code context and env
 * vars, and have its output streamed (EVAL_OPTS); contexts themselves are in eval-contexts.ts.
 */
import { ForkdError, errorMessage } from "../util/index.js";
import { guestError } from "./guest-error.js";
import { Msg, Tag, field } from "./codec.js";
import type { Field, FieldInput, Frame } from "./codec.js";
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
  /** The context the cell ran in ("default" unless one was named; null from an old agent). */
  context: string | null;
  /** The cell's number in its context (null from an old agent). */
  execution_count: number | null;
}

/** What a cell may say beyond its code (sent as EVAL_OPTS; none: nothing is sent). */
export interface EvalOptions {
  /** The code context (eval-contexts.ts); absent: the default one. */
  context?: string;
  /** Variables the cell sees (the kernel's environment is restored after it). */
  env?: Record<string, string>;
  /**
   * The cell's stdout and stderr as they come, while it runs: with it the reply's stdout and
   * stderr are empty (everything went here, also from an agent that cannot stream).
   */
  onOutput?: (stream: "stdout" | "stderr", text: string) => void;
  /**
   * Its caller gave the cell up (its client left): a cell still waiting is dropped, the running
   * one interrupted as at its timeout (KeyboardInterrupt: the kernel keeps its state). The call
   * still settles with the guest's answer.
   */
  signal?: AbortSignal;
}

/** EVAL on a stream of its own: intermediate output frames, EVAL_INTERRUPT on abort. */
function evalRequest(
  conn: AgentConnection,
  fields: readonly FieldInput[],
  timeoutMs: number,
  onFrame: (f: Frame) => void,
  signal: AbortSignal | undefined,
): Promise<Field[]> {
  return new Promise((resolve, reject) => {
    let stream = 0;
    let settled = false;
    const onAbort = () => {
      if (!settled && stream !== 0 && !conn.closed) conn.send(Msg.EVAL_INTERRUPT, stream);
    };
    const timer = setTimeout(() => {
      conn.end(stream);
      finish(new ForkdError("timeout", `eval timed out after ${timeoutMs} ms (the guest did not answer)`));
    }, timeoutMs);
    const finish = (err: ForkdError | null, f?: Field[]) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      conn.end(stream);
      if (err) reject(err);
      else resolve(f ?? []);
    };
    try {
      stream = conn.open((f) => {
        if (f instanceof ForkdError) return finish(f);
        if (f.type === Msg.OK) return finish(null, f.fields);
        if (f.type === Msg.ERROR) return finish(guestError(f.fields));
        onFrame(f);
      });
      conn.send(Msg.EVAL, stream, fields);
      if (signal?.aborted) onAbort();
      else signal?.addEventListener("abort", onAbort, { once: true });
    } catch (e) {
      finish(e instanceof ForkdError ? e : new ForkdError("internal", errorMessage(e)));
    }
  });
}

/** The kernels an EVAL can name. */
export const EVAL_LANGUAGES = ["python", "javascript"] as const;
export type EvalLanguage = (typeof EVAL_LANGUAGES)[number];

/** The guest interrupts the cell at its timeout; it has this long more to answer. */
const EVAL_GRACE_MS = 5_000;
/** The guest's errno for a kernel the image cannot run. */
const ENOENT = 2;

/** The EVAL_OPTS line for `o`, or null when it says nothing. */
export function evalOptsLine(o: EvalOptions): string | null {
  const opts: Record<string, unknown> = {};
  if (o.context !== undefined && o.context !== "default") opts.context = o.context;
  if (o.env && Object.keys(o.env).length > 0) opts.env = o.env;
  if (o.onOutput) opts.stream = true;
  return Object.keys(opts).length > 0 ? JSON.stringify(opts) : null;
}

/** Runs a cell. Python is not named on the wire (an agent older than kernels has only it). */
export async function evalCode(
  conn: AgentConnection,
  code: string,
  timeoutMs = DEFAULT_TIMEOUT_MS,
  language: EvalLanguage = "python",
  o: EvalOptions = {},
): Promise<EvalResult> {
  const fields: FieldInput[] = [
    [Tag.CODE, code],
    [Tag.TIMEOUT_MS, timeoutMs],
  ];
  if (language !== "python") fields.push([Tag.LANGUAGE, language]);
  const line = evalOptsLine(o);
  if (line !== null) fields.push([Tag.EVAL_OPTS, line]);
  const onOutput = o.onOutput;
  const onFrame = (fr: Frame) => {
    if (fr.type !== Msg.EVAL_STDOUT && fr.type !== Msg.EVAL_STDERR) {
      throw new ForkdError("agent_protocol", `unexpected frame 0x${fr.type.toString(16)} from guest`);
    }
    const data = field(fr.fields, Tag.DATA);
    if (onOutput && data && data.length > 0) {
      onOutput(fr.type === Msg.EVAL_STDOUT ? "stdout" : "stderr", data.toString("utf8"));
    }
  };
  let f: Field[];
  try {
    f = await evalRequest(conn, fields, timeoutMs + EVAL_GRACE_MS, onFrame, o.signal);
  } catch (e) {
    // ENOENT is only ever the guest saying it has no such kernel (its message names what is missing)
    if (e instanceof ForkdError && e.details.errno === ENOENT) {
      throw new ForkdError("unavailable", e.message, { ...e.details, language });
    }
    throw e;
  }
  const json = field(f, Tag.JSON);
  if (!json) throw new ForkdError("agent_protocol", "eval reply without JSON");
  const { context_error: contextError, ...r } = parseEvalJson(json);
  if (contextError === "not_found") {
    throw new ForkdError("not_found", `no code context '${o.context ?? ""}' in the ${language} kernel`, {
      context: o.context,
      language,
    });
  }
  if (line !== null && r.context === null) {
    // an agent older than EVAL_OPTS ran the cell without its context and env
    throw new ForkdError(
      "unavailable",
      "code contexts and per-cell env need a newer guest agent than this sandbox's: make its snapshot again",
      { feature: "eval options" },
    );
  }
  if (onOutput) {
    if (r.stdout) onOutput("stdout", r.stdout);
    if (r.stderr) onOutput("stderr", r.stderr);
    r.stdout = r.stderr = "";
  }
  return r;
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
export function parseEvalJson(buf: Buffer): EvalResult & { context_error?: string } {
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
  const count = o.execution_count;
  return {
    context: typeof o.context === "string" ? o.context : null,
    execution_count: typeof count === "number" && Number.isSafeInteger(count) ? count : null,
    context_error: typeof o.context_error === "string" ? o.context_error : undefined,
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
