/**
 * A Dockerfile's logical lines: the parser directives at its top (`# escape=`, `# syntax=`),
 * comments dropped, lines joined where one ends with the escape character, each logical line
 * with the number of the physical line it starts on. Bounded: size, lines and instructions.
 */
import { ForkdError } from "../../util/index.js";

export const DOCKERFILE_LIMITS = {
  /** Bytes of the Dockerfile's text. */
  bytes: 1 << 20,
  /** Physical lines. */
  lines: 20_000,
  /** Instructions (logical lines). */
  instructions: 1_000,
};

export interface LogicalLine {
  /** 1-based number of the physical line the instruction starts on. */
  line: number;
  text: string;
}

export interface Lines {
  escape: "\\" | "`";
  lines: LogicalLine[];
}

export const syntaxError = (line: number, msg: string, details: Record<string, unknown> = {}): ForkdError =>
  new ForkdError("invalid_argument", `Dockerfile line ${line}: ${msg}`, { line, ...details });

const DIRECTIVE_RE = /^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.*?)\s*$/;

export function logicalLines(text: string): Lines {
  if (Buffer.byteLength(text, "utf8") > DOCKERFILE_LIMITS.bytes) {
    throw new ForkdError(
      "invalid_argument",
      `the Dockerfile is larger than ${DOCKERFILE_LIMITS.bytes} bytes`,
    );
  }
  if (text.includes("\0")) throw new ForkdError("invalid_argument", "the Dockerfile holds a NUL byte");
  const physical = text.replace(/^\uFEFF/, "").split(/\r?\n/);
  if (physical.length > DOCKERFILE_LIMITS.lines) {
    throw new ForkdError("invalid_argument", `the Dockerfile has more than ${DOCKERFILE_LIMITS.lines} lines`);
  }
  let escape: "\\" | "`" = "\\";
  let i = 0;
  // Parser directives: only before anything else (a blank line, a comment or an instruction ends them).
  const seen = new Set<string>();
  for (; i < physical.length; i++) {
    const m = DIRECTIVE_RE.exec(physical[i] ?? "");
    if (!m) break;
    const name = (m[1] ?? "").toLowerCase();
    const value = m[2] ?? "";
    if (seen.has(name)) throw syntaxError(i + 1, `the parser directive ${name} is given twice`);
    seen.add(name);
    if (name === "escape") {
      if (value !== "\\" && value !== "`") {
        throw syntaxError(i + 1, `escape must be \\ or \` (not ${JSON.stringify(value)})`);
      }
      escape = value;
    }
    // `syntax`, `check` and unknown directives: comments, as Docker's own parser treats them
    // without BuildKit frontends (forkd has none).
  }
  const out: LogicalLine[] = [];
  let cur: string | null = null;
  let start = 0;
  const cont = escape === "\\" ? /\\[ \t]*$/ : /`[ \t]*$/;
  for (; i < physical.length; i++) {
    const raw = physical[i] ?? "";
    const trimmed = raw.trimStart();
    if (trimmed.startsWith("#")) continue; // a comment, also inside a continued instruction
    if (cur === null) {
      if (trimmed === "") continue;
      start = i + 1;
      cur = "";
    } else if (trimmed === "") continue; // empty lines inside a continuation are skipped (Docker warns)
    const m = cont.exec(raw);
    if (m) {
      cur += raw.slice(0, m.index);
      continue;
    }
    cur += raw;
    out.push({ line: start, text: cur.trim() });
    cur = null;
    if (out.length > DOCKERFILE_LIMITS.instructions) {
      throw syntaxError(start, `more than ${DOCKERFILE_LIMITS.instructions} instructions`);
    }
  }
  if (cur !== null && cur.trim() !== "") out.push({ line: start, text: cur.trim() });
  return { escape, lines: out };
}
