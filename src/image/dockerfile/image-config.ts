/**
 * The image config as the guest reads it (docs/images.md, "/.forkd"): `/.forkd/env` holds
 * `KEY=VALUE` entries each ended by a NUL byte; `/.forkd/config` lines `key=value` (`cwd`,
 * `user`; `cmd` and `entrypoint` as JSON arrays, recorded for people and tools, never started).
 */
import type { ImageConfig } from "./plan.js";

export function configFiles(c: ImageConfig): { env: Buffer; config: Buffer } {
  const env = Buffer.from(c.env.map((e) => `${e}\0`).join(""), "utf8");
  const lines: string[] = [];
  // A value with a newline cannot be a line: left out (the parser's expansion can make one).
  const put = (k: string, v: string | null) => {
    if (v !== null && !v.includes("\n")) lines.push(`${k}=${v}`);
  };
  put("cwd", c.workingDir);
  put("user", c.user);
  put("cmd", c.cmd ? JSON.stringify(c.cmd) : null);
  put("entrypoint", c.entrypoint ? JSON.stringify(c.entrypoint) : null);
  return { env, config: Buffer.from(lines.map((l) => `${l}\n`).join(""), "utf8") };
}
