/** Code-interpreter results, shaped like E2B's: Execution, Result, ExecutionError, Logs. */
import type { EvalResultWire } from "./types.js";

export interface ExecutionError {
  name: string;
  value: string;
  traceback: string;
}

export interface Logs {
  stdout: string[];
  stderr: string[];
}

/** One output of a cell: its final expression's value (isMainResult) or a displayed object. */
export class Result {
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  /** base64 */
  png?: string;
  /** base64 */
  jpeg?: string;
  json?: unknown;
  latex?: string;
  javascript?: string;
  pdf?: string;
  /** E2B's chart data, when the kernel sends it. */
  chart?: unknown;
  isMainResult: boolean;
  /** Every MIME type the guest sent, by type. */
  raw: Record<string, unknown>;

  constructor(raw: Record<string, unknown>, isMainResult: boolean) {
    this.raw = raw;
    this.isMainResult = isMainResult;
    const str = (k: string) => (typeof raw[k] === "string" ? raw[k] : undefined);
    this.text = str("text/plain");
    this.html = str("text/html");
    this.markdown = str("text/markdown");
    this.svg = str("image/svg+xml");
    this.png = str("image/png");
    this.jpeg = str("image/jpeg");
    this.json = raw["application/json"];
    this.latex = str("text/latex");
    this.javascript = str("application/javascript");
    this.pdf = str("application/pdf");
    this.chart = raw["application/vnd.e2b.chart+json"];
  }

  formats(): string[] {
    return Object.keys(this.raw);
  }
}

/** E2B's code Context: an interpreter state of its own (globals, cwd) in one language. */
export class Context {
  constructor(
    readonly id: string,
    readonly language: "python" | "javascript" = "python",
    readonly cwd?: string,
  ) {}

  /** @internal */
  static of(w: Record<string, unknown>): Context {
    const id = typeof w.id === "string" ? w.id : typeof w.context_id === "string" ? w.context_id : "";
    const lang = w.language === "javascript" ? "javascript" : "python";
    return new Context(id, lang, typeof w.cwd === "string" ? w.cwd : undefined);
  }
}

export class Execution {
  constructor(
    readonly results: Result[] = [],
    readonly logs: Logs = { stdout: [], stderr: [] },
    readonly error?: ExecutionError,
    /** The cell's number in its kernel (when the daemon reports it). */
    readonly executionCount?: number,
  ) {}

  /** The text of the main result (the cell's final expression), if there is one. */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }

  toJSON(): Record<string, unknown> {
    return {
      results: this.results.map((r) => r.raw),
      logs: this.logs,
      error: this.error,
      executionCount: this.executionCount,
    };
  }
}

/** @internal */
export function executionOf(w: EvalResultWire): Execution {
  const results: Result[] = [];
  for (const d of w.display ?? []) results.push(new Result(d, false));
  if (w.value !== null) results.push(new Result({ "text/plain": w.value, ...(w.value_data ?? {}) }, true));
  return new Execution(
    results,
    { stdout: w.stdout ? [w.stdout] : [], stderr: w.stderr ? [w.stderr] : [] },
    w.error ?? undefined,
    (w as { execution_count?: number }).execution_count,
  );
}
