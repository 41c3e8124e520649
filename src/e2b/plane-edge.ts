/**
 * The edge of E2B's sandbox plane: a request, once authorized (auth.ts), takes its caller's rate
 * and in-flight slots (src/app/admission.ts) (the caller: the key's,
 * or for an access token or an unsecured sandbox the sandbox's owner), held until its reply ends
 * or the client goes (a stream holds its slot as long as it runs; a resume is a heavy slot), and
 * when it is over one audit line is written (src/app/call-record.ts) for what changes a sandbox: envd's mutating calls
 * (process Start and SendSignal, file uploads, Remove, Move, MakeDir), the code interpreter's
 * mutating methods, and every request and upgrade to a guest's own port (refused ones included).
 * While it runs it is registered with the credential that opened it (its API key, or the key its
 * access token was issued to: src/access/open-streams.ts), and cut when that is revoked: an envd
 * stream, a code interpreter cell, a relay to a guest's port (HTTP or WebSocket).
 */
import type { IncomingMessage } from "node:http";
import { ANONYMOUS } from "../access/index.js";
import type { Caller } from "../access/index.js";
import { admit, isMutating } from "../app/index.js";
import { recordCall, startCall } from "../app/index.js";
import type { E2bServices } from "./context.js";
import type { SandboxAccess } from "./plane-target.js";
import { e2bOf } from "./auth.js";
import { ENVD_PORT, INTERPRETER_PORT } from "./sandbox-plane.js";
import type { SandboxTarget } from "../http/index.js";

/** envd's Connect calls that change the sandbox (the rest read it or stream from it). */
const ENVD_MUTATING = new Set([
  "/process.Process/Start",
  "/process.Process/SendSignal",
  "/filesystem.Filesystem/Remove",
  "/filesystem.Filesystem/Move",
  "/filesystem.Filesystem/MakeDir",
]);
/** A guest's path in an audit line at most (its query is never kept: it may hold secrets). */
const MAX_PATH = 200;

/** The path of `req` as an audit line names it: no query, bounded, printable ASCII only. */
function pathOf(req: IncomingMessage): string {
  const path = (req.url ?? "/").split("?")[0]!.replace(/[^\x21-\x7e]/g, "?");
  return path.length > MAX_PATH ? `${path.slice(0, MAX_PATH)}...` : path;
}

/** What request `req` to `t` is recorded as in the audit log, or null when it is not. */
export function planeAction(req: IncomingMessage, t: SandboxTarget, upgrade = false): string | null {
  const method = (req.method ?? "GET").slice(0, 16);
  const path = pathOf(req);
  if (t.port === ENVD_PORT) {
    const audited = method === "POST" && (ENVD_MUTATING.has(path) || path === "/files");
    return audited ? `e2b:envd ${method} ${path}` : null;
  }
  if (t.port === INTERPRETER_PORT) return isMutating(method) ? `e2b:interpreter ${method} ${path}` : null;
  return `e2b:port ${upgrade ? "UPGRADE" : method} ${path}`;
}

/** One sandbox-plane request at the edge: its caller's slots and its audit line. */
export class PlaneCall {
  private caller: Caller = ANONYMOUS;
  private release: (() => void) | null = null;
  private unregister: (() => void) | null = null;
  private ended = false;
  private readonly call = startCall();
  private readonly action: string | null;

  constructor(
    private readonly s: E2bServices,
    private readonly req: IncomingMessage,
    private readonly t: SandboxTarget,
    upgrade = false,
    /** Cuts the request's connection (its credential was revoked). */
    private readonly cut: () => void = () => req.socket.destroy(),
  ) {
    this.action = planeAction(req, t, upgrade);
  }

  /** Takes the slots of the request's caller (throws rate_limited when it has none free). */
  admit(a: SandboxAccess, heavy: boolean): void {
    this.caller = a.caller;
    if (this.ended) return;
    if (!this.unregister)
      this.unregister = e2bOf(this.s).auth.tokens.opened.open(a.caller.credential, () => {
        this.end(0, "token_revoked");
        this.cut();
      });
    if (this.release) return;
    this.release = admit(this.s, a.caller, heavy);
  }

  /** Frees the slots and writes the audit line (once: later calls do nothing). */
  end(status: number, result: string): void {
    if (this.ended) return;
    this.ended = true;
    this.release?.();
    this.release = null;
    this.unregister?.();
    this.unregister = null;
    recordCall(this.s, this.call, {
      caller: this.caller,
      remote: this.req.socket.remoteAddress,
      method: this.req.method ?? "GET",
      status,
      result,
      target: { id: this.t.sandboxId, port: String(this.t.port) },
      action: this.action,
    });
  }
}
