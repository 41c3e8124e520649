/**
 * Who may use E2B's API, and which sandbox on its sandbox plane.
 *
 * Control plane: an API key (X-API-Key, or `Authorization: Bearer`) is one of the daemon's tokens
 * (src/access/tokens.ts; `forkd token create --e2b` makes the `e2b_` + hex form E2B's SDKs want),
 * scoped to its tenant exactly as on forkd's own API.
 *
 * Sandbox plane (authorizeSandbox): a sandbox created `secure` (E2B's default) answers only to
 * its envd access token (X-Access-Token, access-token.ts). Another sandbox answers to its token
 * too, or to an API key of its tenant (or an admin's); one created with `secure: false` also to a
 * request with no credential (E2B's unsecured sandboxes). A sandbox that does not exist, has
 * exited, or is another tenant's is not found, and so is one asked with a credential that does
 * not open it (a wrong or missing access token or key): the same answer in every case, so that
 * the plane tells nothing of which ids exist. An access token is bound to the API key it was
 * handed to: once that key is revoked (or may no longer see the sandbox) the token is refused
 * with 401 (it was a valid token of this sandbox, so saying so tells nothing of which ids exist),
 * and what it opened has been ended (src/access/open-streams.ts). Failed credentials count
 * against the caller's address like failed tokens on forkd's TCP listener.
 */
import type { IncomingMessage } from "node:http";
import type { Caller } from "../access/index.js";
import type { Authenticator } from "../access/index.js";
import { mayHold } from "../app/index.js";
import type { E2bServices } from "./context.js";
import type { ReadonlySandbox } from "../sandbox/index.js";
import { ForkdError } from "../util/index.js";
import { SANDBOX_ID_RE } from "../util/index.js";
import type { E2bContext } from "./context.js";
import type { SandboxAccess } from "./plane-target.js";
import type { SandboxTarget } from "../http/index.js";
import { signedFileRequest } from "./envd/signature.js";

const MAX_KEY = 512;

const header = (req: IncomingMessage, name: string): string | undefined => {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
};

/** The API key a request presents: X-API-Key, else a bearer token; null when it has none. */
export function apiKeyOf(req: IncomingMessage): string | null {
  const key = header(req, "x-api-key")?.trim();
  if (key) return key.length > MAX_KEY ? "" : key;
  const m = /^Bearer +(\S+) *$/i.exec(header(req, "authorization") ?? "");
  return m?.[1] ?? null;
}

/** The caller an API key stands for, or null for a key that is none of the daemon's. */
export function callerOfKey(auth: Authenticator, key: string): Caller | null {
  return key === "" ? null : auth.authenticate(`Bearer ${key}`);
}

/**
 * The caller a sandbox's access token stands for: its owner (null: an admin's sandbox), by the
 * credential the token was issued to (absent: an unsecured sandbox's request without one).
 */
export function ownerCaller(sb: ReadonlySandbox, credential?: string): Caller {
  const owner = sb.record.owner ?? null;
  return {
    name: owner ?? "admin",
    tenant: owner,
    tokenId: null,
    limited: true,
    maxSandboxes: null,
    ...(credential !== undefined ? { credential } : {}),
  };
}

/** Whether the caller of `credential` is still valid and may see sandbox `sb`. */
function credentialOpens(auth: Authenticator, credential: string, sb: ReadonlySandbox): boolean {
  const holder = auth.sessionCaller(credential);
  return holder !== null && mayHold(holder, sb.record.owner);
}

export const e2bOf = (s: E2bServices): E2bContext => {
  if (!s.e2b) throw new ForkdError("unavailable", "E2B's API is not served by this daemon");
  return s.e2b;
};

/**
 * Who may use sandbox `t.sandboxId` on the sandbox plane. Throws not_found for every refusal (a
 * wrong or missing credential answers as a sandbox that does not exist), rate_limited for an
 * address past its failed authentications.
 */
export function authorizeSandbox(s: E2bServices, req: IncomingMessage, t: SandboxTarget): SandboxAccess {
  const e = e2bOf(s);
  const remote = req.socket.remoteAddress ?? "unknown";
  const wait = s.limits.authFailures.blockedFor(remote);
  if (wait > 0)
    throw new ForkdError(
      "rate_limited",
      `too many failed authentications from this address; retry after ${wait} s`,
      {
        retry_after_s: wait,
      },
    );
  // Every refusal is the answer for a sandbox that does not exist, so that a guess learns
  // nothing of which ids exist; a credential that failed counts against the caller's address.
  const refuse = (failed: boolean): ForkdError => {
    if (failed) s.limits.authFailures.fail(remote);
    return new ForkdError("not_found", `sandbox ${t.sandboxId} not found`, { id: t.sandboxId });
  };
  const found = SANDBOX_ID_RE.test(t.sandboxId)
    ? s.sandboxes.list().find((x) => x.record.id === t.sandboxId)
    : undefined;
  const sb = found && found.state !== "exited" ? found : undefined;
  // E2B's code interpreter SDKs send the sandbox's token as E2B-Traffic-Access-Token (the
  // create reply's trafficAccessToken) and, on their /contexts calls, only so
  const token = header(req, "x-access-token") ?? header(req, "e2b-traffic-access-token");
  const key = apiKeyOf(req);
  if (token !== undefined) {
    // Judged whether or not the sandbox exists (the same work either way).
    const credential = e.accessTokens.issuedTo(t.sandboxId, token);
    if (credential === null || !sb) throw refuse(true);
    if (!credentialOpens(e.auth, credential, sb)) {
      s.limits.authFailures.fail(remote);
      throw new ForkdError(
        "unauthenticated",
        "this access token was revoked: the API key it was issued to was revoked; " +
          "connect to the sandbox again with a valid key for a new one",
        { reason: "token_revoked" },
      );
    }
    return { sandbox: sb, caller: ownerCaller(sb, credential) };
  }
  if (key !== null) {
    const caller = callerOfKey(e.auth, key);
    if (!caller) throw refuse(true);
    // A valid key names its caller: another tenant's sandbox is simply not there for it.
    if (!sb || !mayHold(caller, sb.record.owner)) throw refuse(false);
    // A secure sandbox answers only to its X-Access-Token (envdAccessToken).
    if (sb.record.e2b?.secure) throw refuse(true);
    return { sandbox: sb, caller };
  }
  if (sb?.record.e2b?.secure === false) return { sandbox: sb, caller: ownerCaller(sb) };
  // A signed /files URL of envd (the SDK's downloadUrl/uploadUrl) stands for the token it was
  // signed with: one of the sandbox's tokens of a key that may still see it.
  if (sb) {
    const credentials = e.auth.credentialsSeeing(sb.record.owner ?? null);
    const tokens = credentials.map((c) => e.accessTokens.of(sb.record.id, c) ?? "");
    const i = signedFileRequest(req, t, tokens);
    const credential = credentials[i];
    if (credential !== undefined) return { sandbox: sb, caller: ownerCaller(sb, credential) };
  }
  throw refuse(true);
}
