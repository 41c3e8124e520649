/**
 * The tokens file of one daemon (FORKD_TOKENS_FILE, default <data>/tokens.json), a TokenBacking
 * (./tokens.ts): `{"format": 1, "tokens": [...]}`, written atomically (mode 0600) by the daemon;
 * one written by hand is accepted only if it is a regular file owned by the daemon's user (or
 * root) that nobody else may write. A missing file is an empty one.
 */
import { lstat, readFile } from "node:fs/promises";
import { z } from "zod";
import { writeJsonAtomic } from "../util/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { MAX_TOKENS, TokenEntry, checkUnique } from "./token-entry.js";
import type { TokenBacking } from "./token-entry.js";

const MAX_FILE = 4 << 20;
const TokensFile = z.strictObject({ format: z.literal(1), tokens: z.array(TokenEntry).max(MAX_TOKENS) });

export class FileTokens implements TokenBacking {
  constructor(readonly path: string) {}

  get where(): string {
    return `tokens file ${this.path}`;
  }

  async load(): Promise<TokenEntry[]> {
    let st;
    try {
      st = await lstat(this.path);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw new ForkdError("invalid_argument", `cannot read tokens file ${this.path}: ${errorMessage(e)}`);
    }
    if (!st.isFile())
      throw new ForkdError("invalid_argument", `tokens file ${this.path} is not a regular file`);
    const uid = process.geteuid?.() ?? 0;
    if (st.uid !== uid && st.uid !== 0)
      throw new ForkdError(
        "invalid_argument",
        `tokens file ${this.path} is owned by uid ${st.uid}, not by us`,
      );
    if (st.mode & 0o022)
      throw new ForkdError(
        "invalid_argument",
        `tokens file ${this.path} is writable by others (mode ${(st.mode & 0o777).toString(8)}); chmod 600 it`,
      );
    if (st.size > MAX_FILE) throw new ForkdError("invalid_argument", `tokens file ${this.path} is too large`);
    let parsed;
    try {
      parsed = TokensFile.parse(JSON.parse(await readFile(this.path, "utf8")));
    } catch (e) {
      throw new ForkdError("invalid_argument", `tokens file ${this.path} is invalid: ${errorMessage(e)}`);
    }
    checkUnique(parsed.tokens, `tokens file ${this.path}`);
    return parsed.tokens;
  }

  async add(entry: TokenEntry, current: readonly TokenEntry[]): Promise<void> {
    await this.save([...current, entry]);
  }

  async remove(entry: TokenEntry, current: readonly TokenEntry[]): Promise<void> {
    await this.save(current.filter((t) => t.id !== entry.id));
  }

  private async save(entries: TokenEntry[]): Promise<void> {
    await writeJsonAtomic(this.path, { format: 1, tokens: entries }, 0o600);
  }
}
