/**
 * E2B's code context ids over forkd's: a context lives in one kernel, so the id E2B's SDKs see
 * names both, `<language>-<kernel's id>` ("python-default", "javascript-0123456789abcdef"), and
 * E2B's language names map onto forkd's kernels (python; js, javascript; bash runs as a command).
 */
import type { CodeContext, EvalLanguage } from "../../agent/index.js";
import { CONTEXT_ID_RE } from "../../agent/index.js";
import { ForkdError } from "../../util/index.js";

/** What runs a cell of an E2B language: a kernel, or bash as a command. */
export type CellRunner = EvalLanguage | "bash";

/** E2B's `language` (absent: python) as what runs it; others are invalid_argument. */
export function runnerOf(language: string | undefined | null): CellRunner {
  const l = (language ?? "python").toLowerCase();
  if (l === "python" || l === "python3" || l === "") return "python";
  if (l === "js" || l === "javascript" || l === "node") return "javascript";
  if (l === "bash" || l === "sh") return "bash";
  throw new ForkdError(
    "invalid_argument",
    `language '${String(language).slice(0, 40)}' is not supported by forkd's code interpreter ` +
      "(python, js/javascript, bash)",
  );
}

export function e2bContextId(language: EvalLanguage, kernelId: string): string {
  return `${language}-${kernelId}`;
}

/** The kernel and its context id an E2B context id names; a malformed one is not_found. */
export function parseE2bContextId(id: string): { language: EvalLanguage; kernelId: string } {
  const m = /^(python|javascript)-(.+)$/.exec(id);
  if (!m || !CONTEXT_ID_RE.test(m[2]!)) {
    throw new ForkdError("not_found", `no code context '${id.slice(0, 80)}'`);
  }
  return { language: m[1] as EvalLanguage, kernelId: m[2]! };
}

/** A context as E2B's SDKs read it: {id, language, cwd}. */
export function e2bContext(c: CodeContext): { id: string; language: string; cwd: string } {
  return { id: e2bContextId(c.language, c.id), language: c.language, cwd: c.cwd };
}
