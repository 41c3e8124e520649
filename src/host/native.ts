/**
 * forkd's host-side C helpers (native/), built by scripts/install.sh:
 *   - the VMM launcher (native/jailer): every QEMU process starts through it, so per-VM process
 *     policy is set before QEMU's first instruction;
 *   - forkd-memsnap (native/memsnap): a paused VM's private memory pages, for BRANCH.
 */
import { access, constants } from "node:fs/promises";
import { join } from "node:path";
import { REPO_DIR } from "./paths.js";
import { ForkdError } from "../util/index.js";

export const NATIVE_FIX = "build them: make -C native (or run scripts/install.sh)";

async function findHelper(
  override: string | undefined,
  dir: string,
  name: string,
  what: string,
): Promise<string> {
  const path = override ?? join(REPO_DIR, "native", dir, name);
  try {
    await access(path, constants.X_OK);
  } catch {
    throw new ForkdError("unavailable", `${what} ${path} is missing; ${NATIVE_FIX}`);
  }
  return path;
}

/** FORKD_JAILER if set, else the one built in this repository. Throws when it is not executable. */
export const findJailer = (env: NodeJS.ProcessEnv = process.env): Promise<string> =>
  findHelper(env.FORKD_JAILER, "jailer", "forkd-jailer", "VMM launcher");

/** FORKD_MEMSNAP if set, else the one built in this repository. */
export const findMemsnap = (env: NodeJS.ProcessEnv = process.env): Promise<string> =>
  findHelper(env.FORKD_MEMSNAP, "memsnap", "forkd-memsnap", "memory snapshot helper");
