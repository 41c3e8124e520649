/**
 * E2B's home layout in a forkd sandbox: the user commands run as by default and where homes are.
 * E2B's templates have an account `user` (home /home/user) that commands run as and relative file
 * paths resolve against; forkd's own templates have only root. One probe per Sandbox object, on
 * first need, reads the image's /etc/passwd: `user` is the default when the image has it, else
 * the image's own default user (root in forkd's templates, home /root).
 */
import { posix } from "node:path";
import type { Transport } from "./transport.js";
import type { ExecEventWire } from "./types.js";

const PROBE =
  'printf "default %s %s\\n" "$(id -un 2>/dev/null || echo root)" "${HOME:-/}"; ' +
  'while IFS=: read -r n _ _ _ _ d _; do [ -d "$d" ] && printf "%s %s\\n" "$n" "$d"; done < /etc/passwd';

export const E2B_USER = "user";

/** The default user and every account's home, from the probe's output. */
export function parseProbe(text: string): { user: string; homes: Map<string, string> } {
  const homes = new Map<string, string>();
  let def: [string, string] | null = null;
  for (const line of text.split("\n")) {
    const [first, ...rest] = line.split(" ");
    if (!first) continue;
    if (first === "default" && rest.length >= 2) def = [rest[0] ?? "root", rest.slice(1).join(" ")];
    else if (rest.length >= 1) homes.set(first, rest.join(" "));
  }
  if (homes.has(E2B_USER)) return { user: E2B_USER, homes };
  const [name, home] = def ?? ["root", "/root"];
  if (!homes.has(name)) homes.set(name, home);
  return { user: name, homes };
}

/** The stdout of a short helper command (as root unless told), "" if it could not run. */
export async function execOutput(
  t: Transport,
  id: string,
  cmd: string,
  user: string | null = "root",
): Promise<string> {
  const out: Buffer[] = [];
  await t.ndjson<ExecEventWire>(
    "POST",
    `/v1/sandboxes/${id}/exec/stream`,
    (ev) => {
      if (ev.type === "stdout") out.push(Buffer.from(ev.data, "base64"));
    },
    { json: { cmd, timeout_ms: 30_000, ...(user !== null ? { user } : {}) } },
  );
  return Buffer.concat(out).toString("utf8");
}

export class Layout {
  #probed: Promise<{ user: string; homes: Map<string, string> }> | null = null;

  constructor(
    private readonly t: Transport,
    private readonly id: string,
  ) {}

  #probe(): Promise<{ user: string; homes: Map<string, string> }> {
    this.#probed ??= execOutput(this.t, this.id, PROBE, null).then(parseProbe);
    // a failed probe is tried again next time
    this.#probed.catch(() => (this.#probed = null));
    return this.#probed;
  }

  /** The user commands and file operations act as when none is given. */
  async user(): Promise<string> {
    return (await this.#probe()).user;
  }

  /** The home of `user` (default: the default user); undefined for an account the image lacks. */
  async home(user?: string): Promise<string | undefined> {
    const p = await this.#probe();
    return p.homes.get(user ?? p.user);
  }

  /** An absolute path: a relative one joined to the user's home (E2B's rule). */
  async resolve(path: string, user?: string): Promise<string> {
    if (path.startsWith("/")) return path;
    const home = (await this.home(user)) ?? "/";
    return path ? posix.normalize(posix.join(home, path)) : home;
  }
}
