/**
 * Which sandbox port an E2B sandbox-plane request is for, the way E2B's client proxy routes:
 * the `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers (what the SDKs send with
 * E2B_SANDBOX_URL), else a Host of the form `<port>-<sandboxId>.<domain>`. Both are validated
 * strictly: a sandbox id is forkd's (`sb-` + 16 base32 characters), a port 1 to 65535 in
 * decimal; anything else is not a sandbox-plane request (null), or a malformed one (throws).
 */
import type { IncomingMessage } from "node:http";
import { ForkdError } from "../util/errors.js";
import { SANDBOX_ID_RE } from "../util/ids.js";
import type { SandboxTarget } from "./sandbox-plane.js";

const PORT_RE = /^[1-9][0-9]{0,4}$/;
/** `<port>-<id>.` at the start of a Host (the domain after it is whatever the SDK was told). */
const HOST_RE = /^([1-9][0-9]{0,4})-(sb-[a-z2-7]{16})\.[A-Za-z0-9.-]+(?::[0-9]{1,5})?$/;

const one = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

function port(raw: string): number {
  const n = PORT_RE.test(raw) ? Number(raw) : NaN;
  if (!(n >= 1 && n <= 65535))
    throw new ForkdError("invalid_argument", `invalid sandbox port ${JSON.stringify(raw)}`);
  return n;
}

export function sandboxTarget(req: IncomingMessage): SandboxTarget | null {
  const id = one(req.headers["e2b-sandbox-id"]);
  const p = one(req.headers["e2b-sandbox-port"]);
  if (id !== undefined || p !== undefined) {
    if (id === undefined || p === undefined)
      throw new ForkdError("invalid_argument", "E2b-Sandbox-Id and E2b-Sandbox-Port go together");
    if (!SANDBOX_ID_RE.test(id))
      throw new ForkdError("not_found", `sandbox ${JSON.stringify(id.slice(0, 64))} not found`);
    return { sandboxId: id, port: port(p) };
  }
  const host = (one(req.headers.host) ?? "").toLowerCase();
  const m = HOST_RE.exec(host);
  if (!m?.[1] || !m[2]) return null;
  return { sandboxId: m[2], port: port(m[1]) };
}
