/**
 * Which sandbox and port a request on E2B's listener is for, as E2B's client proxy routes:
 * the `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers (what `E2B_SANDBOX_URL` mode sends), else a
 * `<port>-<sandboxId>.<domain>` Host. Neither: the request is for the control plane. PLACEHOLDER
 * until the envd part lands (it replaces this file).
 */
import type { IncomingMessage } from "node:http";
import type { SandboxTarget } from "./sandbox-plane.js";

const HOST_RE = /^(\d{1,5})-([a-z0-9-]{1,64})\.[a-z0-9.-]+(:\d{1,5})?$/i;

export function sandboxTarget(req: IncomingMessage): SandboxTarget | null {
  const id = one(req.headers["e2b-sandbox-id"]);
  const port = one(req.headers["e2b-sandbox-port"]);
  if (id !== undefined && port !== undefined) return target(id, port);
  const m = HOST_RE.exec(one(req.headers.host) ?? "");
  if (m?.[1] !== undefined && m[2] !== undefined) return target(m[2], m[1]);
  return null;
}

const one = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

function target(id: string, port: string): SandboxTarget | null {
  const n = Number(port);
  if (!/^\d{1,5}$/.test(port) || n < 1 || n > 65535 || id.length > 64) return null;
  return { sandboxId: id, port: n };
}
