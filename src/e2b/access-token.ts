/**
 * Per-sandbox envd access tokens (E2B's `envdAccessToken`, sent back as `X-Access-Token`): an
 * HMAC-SHA256 of the sandbox id under a daemon secret, so there is nothing to store per sandbox
 * and a token survives a daemon restart. The secret is 32 random bytes kept as hex in
 * `<data>/e2b-secret` (mode 0600, written atomically once); a file readable by others, or not
 * 32 bytes, stops the daemon.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { lstat, readFile } from "node:fs/promises";
import { join } from "node:path";
import { writeFileAtomic } from "../util/atomic.js";
import { ForkdError, errorMessage } from "../util/errors.js";

const SECRET_FILE = "e2b-secret";
/** What the HMAC is over besides the id: a token is only ever an envd access token. */
const PURPOSE = "forkd e2b envd access token v1\0";

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

  /** The access token of sandbox `id`. */
  of(id: string): string {
    return createHmac("sha256", this.secret).update(PURPOSE).update(id, "utf8").digest("hex");
  }

  /** Whether `presented` is sandbox `id`'s token (constant time). */
  matches(id: string, presented: string): boolean {
    const want = Buffer.from(this.of(id), "utf8");
    const got = Buffer.from(presented, "utf8");
    return got.length === want.length && timingSafeEqual(got, want);
  }
}
