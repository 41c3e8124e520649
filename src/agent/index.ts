/**
 * What agent offers: the client of the guest agent's protocol (exec, files, eval in the warm
 * interpreters, watches, identity) over one connection per sandbox. Other folders import this
 * folder through this file alone (test/unit/layering.test.ts).
 */
export { AgentClient, checkPtySize } from "./client.js";
export type {
  CodeContext,
  Consumed,
  DirEntry,
  ExecHandle,
  ExecHandlers,
  ExecResult,
  FileStat,
  InheritedExec,
} from "./client.js";
export { CONTEXT_ID_RE } from "./eval-contexts.js";
export { EVAL_LANGUAGES } from "./eval.js";
export type { EvalLanguage, EvalResult, MimeBundle } from "./eval.js";
export { withStartExplained } from "./exec-start.js";
export { PTY_MAX } from "./exec.js";
export type { ExecRequest } from "./exec.js";
export type { WatchEvent, WatchHandle } from "./watch.js";
