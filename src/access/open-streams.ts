/**
 * What callers opened that outlives its request, by the credential that opened it: a streamed
 * reply (GET /v1/events, an exec or watch stream), a terminal's WebSocket, a request of E2B's
 * sandbox plane (envd's streams, the code interpreter, a relay to a guest's port), envd's
 * polling watchers. Each door registers what it opens here with how to end it; the token store
 * (tokens.ts) ends everything a credential opened once that credential is revoked, so
 * revocation takes effect at once and not only on the next request.
 *
 * A credential is named as the token store names it: `token:<id>` for a token of the tokens
 * file, `env-admin` for FORKD_TOKEN (see Caller.credential). A caller without one (the unix
 * socket's local admin, an unsecured E2B sandbox's anonymous caller) registers nothing.
 */
import { ForkdError } from "../util/index.js";

/** How an opened thing is ended: told why (the error to show its client), at most once. */
export type EndOpened = (why: ForkdError) => void;

/** The error a client is shown when the credential that opened its stream was revoked. */
export function revokedError(credential: string): ForkdError {
  const id = credential.startsWith("token:") ? credential.slice("token:".length) : null;
  return new ForkdError(
    "unauthenticated",
    id ? `the token that opened this (${id}) was revoked` : "the credential that opened this was revoked",
    { reason: "token_revoked", ...(id ? { token_id: id } : {}) },
  );
}

export class OpenStreams {
  private readonly byCredential = new Map<string, Set<EndOpened>>();

  /**
   * Registers something opened with `credential`; `end` is called (once) if the credential is
   * revoked while it is open. Returns what to call when it ends by itself (idempotent).
   */
  open(credential: string | null | undefined, end: EndOpened): () => void {
    if (!credential) return () => undefined;
    let set = this.byCredential.get(credential);
    if (!set) this.byCredential.set(credential, (set = new Set()));
    let entry: EndOpened | null = end;
    const fn: EndOpened = (why) => {
      if (entry === null) return;
      entry = null;
      end(why);
    };
    set.add(fn);
    return () => {
      entry = null;
      const s = this.byCredential.get(credential);
      if (!s) return;
      s.delete(fn);
      if (s.size === 0) this.byCredential.delete(credential);
    };
  }

  /** What is open now with `credential`. */
  count(credential: string): number {
    return this.byCredential.get(credential)?.size ?? 0;
  }

  /** Ends everything `credential` opened (each told `why`); how many there were. */
  revoke(credential: string, why: ForkdError = revokedError(credential)): number {
    const set = this.byCredential.get(credential);
    if (!set) return 0;
    this.byCredential.delete(credential);
    for (const end of set)
      try {
        end(why);
      } catch {
        // One stream failing to end (its socket already broken) must not spare the others.
      }
    return set.size;
  }
}
