/**
 * A forkd daemon for a benchmark: its own process on a throwaway data dir, waited for, cleaned up.
 * FORKD_BENCH_REPO names another built checkout whose daemon to run (an A/B against main).
 */
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { mkdtemp, open, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { apiRequest } from "../test/helpers/http.js";
import type { Endpoint } from "../test/helpers/http.js";
import { REPO_DIR } from "../src/host/paths.js";
import { pidsReferencing } from "../src/util/proc.js";

export interface BenchDaemon {
  proc: ChildProcess;
  ep: Endpoint;
  dataDir: string;
  api: <T>(method: string, path: string, body?: unknown) => Promise<T>;
  stop(): Promise<void>;
}

/** A new empty data dir for a benchmark's daemon, under `parent` (default: the OS's tmpdir). */
export const benchDataDir = (prefix: string, parent = tmpdir()): Promise<string> =>
  mkdtemp(join(parent, `${prefix}-`));

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
    dataDir,
    api,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 30_000);
      await exited;
      clearTimeout(t);
    },
  };
}

/**
 * The end of a benchmark: its sandboxes deleted, the daemon stopped, any VMM still running on
 * its data dir killed (VMs outlive their daemon by design; a benchmark leaves none behind), and
 * the data dir removed unless `keep` (a failed run keeps it for its daemon.log).
 */
export async function finishDaemon(d: BenchDaemon, keep = false): Promise<void> {
  try {
    const { sandboxes } = await d.api<{ sandboxes: { id: string }[] }>("GET", "/v1/sandboxes");
    await Promise.all(sandboxes.map((s) => d.api("DELETE", `/v1/sandboxes/${s.id}`).catch(() => undefined)));
  } catch {
    /* daemon gone */
  }
  await d.stop().catch(() => undefined);
  for (const pid of await pidsReferencing(d.dataDir)) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      /* gone meanwhile */
    }
  }
  if (!keep) await rm(d.dataDir, { recursive: true, force: true });
}
