/**
 * What a request to one port of an E2B sandbox is, once routed (src/http/sandbox-route.ts) and authorized
 * (auth.ts): its target, who may use the sandbox, and the handler type each port's service
 * implements (envd, the code interpreter, the guest's own ports: sandbox-plane.ts).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Caller } from "../access/index.js";
import type { ReadonlySandbox } from "../sandbox/index.js";
import type { SandboxTarget } from "../http/index.js";

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
