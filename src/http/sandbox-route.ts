/**
 * Which sandbox port an E2B sandbox-plane request is for (E2B's listener of a daemon and a
 * cluster's gateway route by it alike), the way E2B's client proxy routes:
 * the `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers (what the SDKs send with
 * E2B_SANDBOX_URL), else a Host of the form `<port>-<sandboxId>.<domain>`. Both are validated
 * strictly: a sandbox id is forkd's (`sb-` + 16 base32 characters), a port 1 to 65535 in
 * decimal; anything else is not a sandbox-plane request (null: the control plane answers it).
 */
import type { IncomingMessage } from "node:http";
import { SANDBOX_ID_RE } from "../util/index.js";

/** A request's sandbox and port on E2B's sandbox plane. */
export interface SandboxTarget {
  sandboxId: string;
  port: number;
}

const PORT_RE = /^[1-9][0-9]{0,4}$/;
/** `<port>-<id>.` at the start of a Host (the domain after it is whatever the SDK was told). */
const HOST_RE = /^([1-9][0-9]{0,4})-(sb-[a-z2-7]{16})\.[A-Za-z0-9.-]+(?::[0-9]{1,5})?$/;

const one = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

function port(raw: string): number | null {
  const n = PORT_RE.test(raw) ? Number(raw) : NaN;
  return n >= 1 && n <= 65535 ? n : null;
}

/** The target, or null (never throws: it runs in the listener's request event). */
export function sandboxTarget(req: IncomingMessage): SandboxTarget | null {
  const id = one(req.headers["e2b-sandbox-id"]);
  const p = one(req.headers["e2b-sandbox-port"]);
  if (id !== undefined || p !== undefined) {
    const n = port(p ?? "");
    if (id === undefined || n === null || !SANDBOX_ID_RE.test(id)) return null;
    return { sandboxId: id, port: n };
  }
  const host = (one(req.headers.host) ?? "").toLowerCase();
  const m = HOST_RE.exec(host);
  const n = port(m?.[1] ?? "");
  if (!m?.[2] || n === null) return null;
  return { sandboxId: m[2], port: n };
}
