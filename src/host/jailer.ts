/**
 * The VMM launcher (native/jailer/forkd-jailer.c): every QEMU process starts through it so per-VM
 * process policy is set before QEMU's first instruction. Built by scripts/install.sh.
 */
import { access, constants } from "node:fs/promises";
import { join } from "node:path";
import { REPO_DIR } from "./paths.js";
import { ForkdError } from "../util/errors.js";

export const JAILER_FIX = "build it: make -C native (or run scripts/install.sh)";

/** FORKD_JAILER if set, else the one built in this repository. Throws when it is not executable. */
export async function findJailer(env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const path = env.FORKD_JAILER ?? join(REPO_DIR, "native", "jailer", "forkd-jailer");
  try {
    await access(path, constants.X_OK);
  } catch {
    throw new ForkdError("unavailable", `VMM launcher ${path} is missing; ${JAILER_FIX}`);
  }
  return path;
}
