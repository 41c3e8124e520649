/**
 * The lines of E2B's code interpreter `/execute` stream, made from forkd's cell results: one JSON
 * object per line, `type` one of stdout, stderr (`text`, `timestamp`: Unix ns), result (the MIME bundle as
 * E2B's fields (`timestamp` in Unix nanoseconds, as E2B's Python SDK reads it): text, html, markdown, svg, png, jpeg, pdf, latex, json, javascript, other types in
 * `extra`; `is_main_result` for the cell's value), error (`name`, `value`, `traceback`),
 * number_of_executions (`execution_count`) and end_of_execution.
 */
import type { EvalResult, MimeBundle } from "../../agent/index.js";

export type InterpreterLine = Record<string, unknown> & { type: string };

/** MIME type to E2B's result field. */
const FIELDS: Record<string, string> = {
  "text/plain": "text",
  "text/html": "html",
  "text/markdown": "markdown",
  "image/svg+xml": "svg",
  "image/png": "png",
  "image/jpeg": "jpeg",
  "application/pdf": "pdf",
  "text/latex": "latex",
  "application/json": "json",
  "application/javascript": "javascript",
};

export function outputLine(stream: "stdout" | "stderr", text: string, now = new Date()): InterpreterLine {
  return { type: stream, text, timestamp: now.getTime() * 1_000_000 };
}

/** A MIME bundle as E2B's result line. */
export function resultLine(bundle: MimeBundle, isMain: boolean): InterpreterLine {
  const line: InterpreterLine = { type: "result", is_main_result: isMain };
  const extra: Record<string, unknown> = {};
  for (const [mime, data] of Object.entries(bundle)) {
    const name = FIELDS[mime];
    if (name) line[name] = data;
    else extra[mime] = data;
  }
  if (Object.keys(extra).length > 0) line.extra = extra;
  return line;
}

export function errorLine(name: string, value: string, traceback: string): InterpreterLine {
  return { type: "error", name, value, traceback };
}

/** Everything after a cell's output: its displays, its value, its error, its count, the end. */
export function cellEndLines(r: EvalResult): InterpreterLine[] {
  const lines: InterpreterLine[] = r.display.map((b) => resultLine(b, false));
  if (r.value !== null) {
    lines.push(resultLine({ ...(r.value_data ?? {}), "text/plain": r.value }, true));
  }
  if (r.error) lines.push(errorLine(r.error.name, r.error.value, r.error.traceback));
  if (r.execution_count !== null)
    lines.push({ type: "number_of_executions", execution_count: r.execution_count });
  lines.push({ type: "end_of_execution" });
  return lines;
}
