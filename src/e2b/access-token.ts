/**
 * Per-sandbox envd access tokens (E2B's `envdAccessToken`, sent back as `X-Access-Token`), each
 * bound to the API key it was handed to: `<key id>.<HMAC-SHA256 of the sandbox id and that key's
 * credential under a daemon secret>` (`tok-….<hex>` for a token of the tokens file, `admin.<hex>`
 * for FORKD_TOKEN). Nothing is stored per sandbox and a token survives a daemon restart, yet it
 * is revocable: it opens its sandbox only while the key it was issued to is valid and may see
 * that sandbox, so revoking the key (DELETE /v1/tokens/{id}) revokes every access token it was
 * given, and ends the streams they opened (src/access/open-streams.ts); other keys' tokens of the
 * same sandbox go on working. The secret is 32 random bytes kept as hex in `<data>/e2b-secret`
 * (mode 0600, written atomically once); a file readable by others, or not 32 bytes, stops the
 * daemon.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { lstat, readFile } from "node:fs/promises";
import { join } from "node:path";
import { writeFileAtomic } from "../util/index.js";
import { ForkdError, errorMessage } from "../util/index.js";

const SECRET_FILE = "e2b-secret";
/** What the HMAC is over besides the id: a token is only ever an envd access token. */
const PURPOSE = "forkd e2b envd access token v2\0";
/** The key id of a token as it shows in the token, and back. */
const LABEL_RE = /^(tok-[a-z2-7]{12}|admin)\.([0-9a-f]{64})$/;
const labelOf = (credential: string): string | null =>
  credential === "env-admin"
    ? "admin"
    : /^token:tok-[a-z2-7]{12}$/.test(credential)
      ? credential.slice("token:".length)
      : null;
const credentialOfLabel = (label: string): string => (label === "admin" ? "env-admin" : `token:${label}`);

export class AccessTokens {
  private constructor(private readonly secret: Buffer) {
    if (secret.length !== 32) throw new ForkdError("internal", "the access-token secret must be 32 bytes");
  }

  /** From a given secret (tests). */
  static fromSecret(secret: Buffer): AccessTokens {
    return new AccessTokens(secret);
  }

  /** The data directory's secret, made on first use. */
  static async open(dataDir: string): Promise<AccessTokens> {
    const path = join(dataDir, SECRET_FILE);
    let st;
    try {
      st = await lstat(path);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ENOENT")
        throw new ForkdError("invalid_argument", `cannot read ${path}: ${errorMessage(e)}`);
      const secret = randomBytes(32);
      await writeFileAtomic(path, secret.toString("hex") + "\n", 0o600);
      return new AccessTokens(secret);
    }
    if (!st.isFile() || st.mode & 0o077)
      throw new ForkdError(
        "invalid_argument",
        `${path} must be a regular file only the daemon may read (chmod 600)`,
      );
    const hex = (await readFile(path, "utf8")).trim();
    if (!/^[0-9a-f]{64}$/.test(hex))
      throw new ForkdError("invalid_argument", `${path} is not 32 bytes of hex`);
    return new AccessTokens(Buffer.from(hex, "hex"));
  }

  private mac(id: string, credential: string): string {
    return createHmac("sha256", this.secret)
      .update(PURPOSE)
      .update(id, "utf8")
      .update("\0")
      .update(credential, "utf8")
      .digest("hex");
  }

  /**
   * The access token of sandbox `id` for the caller that came by `credential` (Caller.credential);
   * null for a caller without one (none reaches E2B's API: it needs a key).
   */
  of(id: string, credential: string | undefined): string | null {
    if (credential === undefined) return null;
    const label = labelOf(credential);
    return label === null ? null : `${label}.${this.mac(id, credential)}`;
  }

  /**
   * The credential `presented` was issued to when it is one of sandbox `id`'s tokens, else null
   * (constant time in the token's secret part). Whether that credential is still valid is the
   * caller's to check.
   */
  issuedTo(id: string, presented: string): string | null {
    const m = LABEL_RE.exec(presented);
    const credential = m ? credentialOfLabel(m[1]!) : "token:tok-aaaaaaaaaaaa";
    // The same work for a malformed token as for a well-formed one.
    const want = Buffer.from(this.mac(id, credential), "utf8");
    const got = Buffer.from(m?.[2] ?? "0".repeat(64), "utf8");
    return timingSafeEqual(got, want) && m ? credential : null;
  }
}
