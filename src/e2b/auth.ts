/**
 * PLACEHOLDER (envd branch only): who may use a sandbox on the sandbox plane. The `control`
 * helper's auth.ts replaces this file; only the type envd's code needs is here.
 */
import type { Caller } from "../access/caller.js";
import type { ReadonlySandbox } from "../sandbox/sandbox.js";

export interface SandboxAccess {
  sandbox: ReadonlySandbox;
  caller: Caller;
}
