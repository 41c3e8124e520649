/**
 * What every command is given, built once in main() from the environment (nothing is read at
 * import): the SDK's route-level client, the local paths, where messages go, and `ready()`,
 * which starts a local daemon first when none answers (once per run).
 */
import { readFileSync } from "node:fs";
import { ApiClient } from "@forkd/sdk";
import type { ConnectionOpts } from "@forkd/sdk";
import { defaultPaths } from "../host/index.js";
import type { Paths } from "../host/index.js";
import { ensureDaemon } from "./autostart.js";

export interface CliContext {
  /** The environment main() was given (read nowhere else). */
  readonly env: NodeJS.ProcessEnv;
  readonly paths: Paths;
  /** The daemon's API, through the TypeScript SDK. */
  readonly api: ApiClient;
  /** Messages for the user (stderr); results go to stdout. */
  readonly say: (line: string) => void;
  /** Where progress is drawn: a live line on a terminal, plain lines otherwise. */
  readonly progressOut: NodeJS.WriteStream;
  /** The client, once a daemon answers (a local one is started if none does). */
  ready(): Promise<ApiClient>;
}

/** FORKD_URL (+ FORKD_TOKEN, FORKD_CA_CERT) names a remote daemon; else the local socket. */
function connectionFromEnv(env: NodeJS.ProcessEnv, paths: Paths): ConnectionOpts {
  if (!env.FORKD_URL) return { socket: paths.socket, token: "" };
  return {
    url: env.FORKD_URL,
    token: env.FORKD_TOKEN ?? "",
    ...(env.FORKD_CA_CERT ? { ca: readFileSync(env.FORKD_CA_CERT) } : {}),
  };
}

export function makeContext(env: NodeJS.ProcessEnv, say: (line: string) => void): CliContext {
  const paths = defaultPaths(env);
  const conn = connectionFromEnv(env, paths);
  const api = new ApiClient(conn);
  let started: Promise<void> | null = null;
  return {
    env,
    paths,
    api,
    say,
    progressOut: process.stderr,
    async ready() {
      // A remote daemon is the user's to run; a local one is started on first need.
      if (conn.url === undefined) {
        started ??= ensureDaemon(api, paths, say);
        await started;
      }
      return api;
    },
  };
}
