/**
 * The sandbox plane's handler type for one guest port, declared here as
 * /work/helpers/issue14-interfaces.md fixes it until src/e2b/sandbox-plane.ts (envd's) and
 * src/e2b/auth.ts (control's) are on this branch: then these become re-exports of theirs.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Caller } from "../../access/caller.js";
import type { ReadonlySandbox } from "../../sandbox/sandbox.js";

/** Which sandbox and guest port a sandbox-plane request is for. */
export interface SandboxTarget {
  sandboxId: string;
  port: number;
}

/** Who may use the sandbox (authorizeSandbox's answer). */
export interface SandboxAccess {
  sandbox: ReadonlySandbox;
  caller: Caller;
}

export type SandboxPortHandler = (
  req: IncomingMessage,
  res: ServerResponse,
  t: SandboxTarget,
  sb: SandboxAccess,
) => void;
