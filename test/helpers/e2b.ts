/**
 * A daemon serving E2B's API for the E2B integration tests (one per file): FORKD_E2B_LISTEN on a
 * free loopback port, an E2B API key of tenant `e2b` (made with `forkd token create --e2b`), and
 * the snapshot E2B's templates look like (a Dockerfile FROM forkd://python with a `user` account
 * whose home is the working directory), tagged `e2b-base`. `env` is what E2B's SDKs read.
 */
import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { ApiClient } from "@forkd/sdk";
import { contextPaths, contextTar } from "../../src/cli/build-context.js";
import { CLI, makeDaemon } from "./daemon.js";
import type { TestDaemon } from "./daemon.js";
import { freePort } from "./port.js";

export const E2B_TEMPLATE = "e2b-base";
export const E2B_TENANT = "e2b";

export const E2B_DOCKERFILE = `FROM forkd://python
RUN useradd -m -s /bin/bash user
USER user
WORKDIR /home/user
`;

export interface E2bEnv {
  E2B_API_URL: string;
  E2B_SANDBOX_URL: string;
  E2B_API_KEY: string;
}

export interface E2bDaemon {
  daemon: TestDaemon;
  env: E2bEnv;
  template: string;
  /** A new E2B API key of `tenant`. */
  keyFor(tenant: string): Promise<string>;
}

/** `forkd token create --tenant T --e2b`: the key it prints. */
async function createKey(d: TestDaemon, tenant: string): Promise<string> {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [CLI, "token", "create", "--tenant", tenant, "--e2b"],
    {
      env: d.env,
      timeout: 60_000,
    },
  );
  return stdout.trim();
}

/** Builds the E2B-style snapshot as the local admin (shared: every tenant may create from it). */
async function buildTemplate(d: TestDaemon, tag: string): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-e2b-"));
  try {
    await writeFile(join(dir, "Dockerfile"), E2B_DOCKERFILE);
    const tar = contextTar(dir, await contextPaths(dir, join(dir, "Dockerfile")));
    await Promise.all([
      new ApiClient({ socket: d.ep.socket }).buildSnapshot({ tag }, tar.stream, { timeoutMs: 30 * 60_000 }),
      tar.done,
    ]);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

export async function startE2bDaemon(extraEnv: Record<string, string> = {}): Promise<E2bDaemon> {
  const port = await freePort();
  const daemon = await makeDaemon({ FORKD_E2B_LISTEN: `127.0.0.1:${port}`, ...extraEnv });
  try {
    await buildTemplate(daemon, E2B_TEMPLATE);
    const url = `http://127.0.0.1:${port}`;
    return {
      daemon,
      env: { E2B_API_URL: url, E2B_SANDBOX_URL: url, E2B_API_KEY: await createKey(daemon, E2B_TENANT) },
      template: E2B_TEMPLATE,
      keyFor: (tenant) => createKey(daemon, tenant),
    };
  } catch (e) {
    await daemon.destroy(true).catch(() => undefined);
    throw e;
  }
}
