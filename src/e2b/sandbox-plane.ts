/**
 * E2B's sandbox plane: a request routed to one port of one sandbox (src/http/sandbox-route.ts) and already
 * authorized (auth.ts) goes to envd's API on 49983 (envd/handler.ts), to the code interpreter
 * on 49999 (the handler passed in), and on any other port to the guest's own service, reached
 * like forkd's getHost (guest-port.ts).
 */
import type { E2bServices } from "./context.js";
import type { SandboxPortHandler } from "./plane-target.js";
import { envdHandler } from "./envd/handler.js";
import { guestPortHandler } from "./guest-port.js";

/** envd's port in every E2B sandbox. */
export const ENVD_PORT = 49983;
/** The code interpreter's port. */
export const INTERPRETER_PORT = 49999;

export function createSandboxPlane(
  s: E2bServices,
  o: { interpreter: SandboxPortHandler },
): SandboxPortHandler {
  const envd = envdHandler(s).handle;
  const guest = guestPortHandler(s);
  return (req, res, t, sb) => {
    if (t.port === ENVD_PORT) return envd(req, res, t, sb);
    if (t.port === INTERPRETER_PORT) return o.interpreter(req, res, t, sb);
    return guest(req, res, t, sb);
  };
}
