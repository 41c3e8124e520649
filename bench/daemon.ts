/**
 * A forkd daemon for a benchmark: its own process on a throwaway data dir, waited for.
 * FORKD_BENCH_REPO names another built checkout whose daemon to run (an A/B against main).
 */
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { open } from "node:fs/promises";
import { join } from "node:path";
import { apiRequest } from "../test/helpers/http.js";
import type { Endpoint } from "../test/helpers/http.js";
import { REPO_DIR } from "../src/host/paths.js";

export interface BenchDaemon {
  proc: ChildProcess;
  ep: Endpoint;
  api: <T>(method: string, path: string, body?: unknown) => Promise<T>;
  stop(): Promise<void>;
}

export async function startDaemon(dataDir: string, env: Record<string, string> = {}): Promise<BenchDaemon> {
  const ep: Endpoint = { socket: join(dataDir, "forkd.sock") };
  const log = await open(join(dataDir, "daemon.log"), "a");
  const repo = process.env.FORKD_BENCH_REPO ?? REPO_DIR;
  const proc = spawn(process.execPath, [join(repo, "dist/src/cli/main.js"), "daemon"], {
    env: { ...process.env, FORKD_DATA_DIR: dataDir, ...env },
    stdio: ["ignore", log.fd, log.fd],
  });
  await log.close();
  const api = <T>(m: string, p: string, b?: unknown) => apiRequest<T>(ep, m, p, b, 1_800_000);
  for (let i = 0; ; i++) {
    try {
      await api("GET", "/v1/health");
      break;
    } catch (e) {
      if (i > 300 || proc.exitCode !== null) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return {
    proc,
    ep,
    api,
    async stop() {
      if (proc.exitCode !== null) return;
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      await exited;
    },
  };
}
