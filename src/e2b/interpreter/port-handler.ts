/**
 * The sandbox plane's handler type for one guest port, and what it is given (the target and who
 * may use the sandbox): src/e2b/sandbox-plane.ts and src/e2b/auth.ts define them; re-exported
 * here so the interpreter's files name one place.
 */
export type { SandboxPortHandler, SandboxTarget } from "../sandbox-plane.js";
export type { SandboxAccess } from "../auth.js";
