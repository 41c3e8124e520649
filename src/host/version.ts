/** forkd's own version, from package.json. */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_DIR } from "./paths.js";

export const VERSION: string = (
  JSON.parse(readFileSync(join(REPO_DIR, "package.json"), "utf8")) as { version: string }
).version;
