/**
 * E2B's sandbox plane: a request routed to one port of one sandbox (routing.ts), already
 * authorized (auth.ts). PLACEHOLDER until the envd part lands (it replaces this file): port 49999
 * goes to the code interpreter's handler, every other port is answered 501.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Services } from "../api/services.js";
import { ForkdError } from "../util/errors.js";
import type { SandboxAccess } from "./auth.js";
import { sendE2bError } from "./errors.js";

export interface SandboxTarget {
  sandboxId: string;
  port: number;
}

export type SandboxPortHandler = (
  req: IncomingMessage,
  res: ServerResponse,
  t: SandboxTarget,
  sb: SandboxAccess,
) => void;

/** The code interpreter's port. */
export const INTERPRETER_PORT = 49999;

export function createSandboxPlane(_s: Services, o: { interpreter: SandboxPortHandler }): SandboxPortHandler {
  return (req, res, t, sb) => {
    if (t.port === INTERPRETER_PORT) return o.interpreter(req, res, t, sb);
    req.resume();
    sendE2bError(res, new ForkdError("unavailable", `port ${t.port} of a sandbox is not served yet`));
  };
}
