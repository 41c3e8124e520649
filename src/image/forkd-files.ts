/**
 * The image config a guest honours, as the files build.sh puts in /.forkd/ (the agent reads
 * them: docs/images.md): `env`, the image's Env as KEY=VALUE entries each ended by a NUL byte,
 * and `config`, `key=value` lines (cwd, user). Image configs are untrusted: bounded, and an
 * entry that cannot be written in these formats is refused with a clear error.
 */
import { ForkdError } from "../util/index.js";
import type { RootfsImageConfig } from "./rootfs-image.js";

const MAX_ENV_ENTRIES = 4096;
const MAX_ENV_BYTES = 1 << 20;
const MAX_VALUE = 4096;
const ENV_KEY_RE = /^[^=\0]+$/;

const bad = (field: string, why: string): ForkdError =>
  new ForkdError("invalid_argument", `the image's config: ${field} ${why}`, { field: `config.${field}` });

/** /.forkd/env for `env` ("KEY=VALUE" entries; empty: no file). */
export function forkdEnvFile(env: readonly string[]): Buffer {
  if (env.length > MAX_ENV_ENTRIES) throw bad("Env", `has more than ${MAX_ENV_ENTRIES} entries`);
  const parts: Buffer[] = [];
  let size = 0;
  for (const e of env) {
    const eq = e.indexOf("=");
    if (eq <= 0 || !ENV_KEY_RE.test(e.slice(0, eq)) || e.includes("\0"))
      throw bad("Env", `entry ${JSON.stringify(e.slice(0, 80))} is not KEY=VALUE`);
    const b = Buffer.from(`${e}\0`, "utf8");
    size += b.length;
    if (size > MAX_ENV_BYTES) throw bad("Env", `is larger than ${MAX_ENV_BYTES} bytes`);
    parts.push(b);
  }
  return Buffer.concat(parts);
}

function line(key: string, field: string, v: string | null): string {
  if (v === null || v === "") return "";
  if (v.length > MAX_VALUE || /[\n\r\0]/.test(v)) throw bad(field, "is too long or holds a line break");
  return `${key}=${v}\n`;
}

/** /.forkd/config for the image's WorkingDir and User (empty: no file, the defaults). */
export function forkdConfigFile(c: Pick<RootfsImageConfig, "workingDir" | "user">): string {
  if (c.workingDir && !c.workingDir.startsWith("/")) throw bad("WorkingDir", "is not an absolute path");
  return line("cwd", "WorkingDir", c.workingDir) + line("user", "User", c.user);
}

/** The image's Env as a map (the last of a repeated key wins, as in Docker). */
export function envMap(env: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of env) {
    const eq = e.indexOf("=");
    if (eq > 0) out[e.slice(0, eq)] = e.slice(eq + 1);
  }
  return out;
}
