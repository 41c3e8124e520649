/**
 * Integration-test harness: a real daemon in its own process (so it can be SIGKILLed and
 * restarted), on a throwaway data dir, sharing the guest image cache. On failure, the daemon
 * log and VM consoles are kept and their path printed.
 *
 * The host's network is left as it was found: destroy() stops every process the daemon
 * started (an `ip` or `nft` still running when the daemon is killed would otherwise make a
 * namespace, an interface or the host table again after they were removed), removes the
 * daemon's network instance, and fails if any of it remains.
 */
import { spawn, execFile } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { mkdtemp, open, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { apiRequest } from "./http.js";
import type { Endpoint } from "./http.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { teardownInstance } from "../../src/net/pool.js";
import { instanceId, instanceOf } from "../../src/net/slots.js";
import { instanceState } from "./net-state.js";
import { descendants, isAlive } from "./proc-tree.js";

export const CLI = join(REPO_DIR, "dist/src/cli/main.js");

export interface TestDaemon {
  dataDir: string;
  ep: Endpoint;
  env: NodeJS.ProcessEnv;
  proc: ChildProcess;
  start(): Promise<void>;
  kill9(): Promise<void>;
  /** Stops the daemon and kills every sandbox it knows (via the API), then removes the data dir. */
  destroy(keep: boolean): Promise<void>;
}

export async function makeDaemon(extraEnv: Record<string, string> = {}): Promise<TestDaemon> {
  const dataDir = await mkdtemp(join(tmpdir(), "forkd-it-"));
  const env = {
    ...process.env,
    FORKD_DATA_DIR: dataDir,
    FORKD_ACCEL: process.env.FORKD_ACCEL ?? "tcg",
    ...extraEnv,
  };
  const ep = { socket: join(dataDir, "forkd.sock") };
  const netId = instanceId(dataDir, env);
  // What of this instance id exists already (another daemon's, were two ids to collide).
  const netBefore = new Set(await instanceState(netId));
  const d: TestDaemon = {
    dataDir,
    ep,
    env,
    proc: undefined as unknown as ChildProcess,
    async start() {
      const log = await open(join(dataDir, "daemon.log"), "a");
      d.proc = spawn(process.execPath, [CLI, "daemon"], { env, stdio: ["ignore", log.fd, log.fd] });
      await log.close();
      const deadline = Date.now() + 60_000;
      for (;;) {
        try {
          await apiRequest(ep, "GET", "/v1/health", undefined, 2_000);
          return;
        } catch (e) {
          if (d.proc.exitCode !== null) throw new Error(`daemon exited: see ${dataDir}/daemon.log`);
          if (Date.now() > deadline) throw e;
          await new Promise((r) => setTimeout(r, 100));
        }
      }
    },
    async kill9() {
      if (d.proc.exitCode !== null || d.proc.signalCode !== null) return;
      const exited = new Promise((r) => d.proc.once("exit", r));
      d.proc.kill("SIGKILL");
      await exited;
    },
    async destroy(keep) {
      try {
        const { sandboxes } = await apiRequest<{ sandboxes: { id: string }[] }>(
          ep,
          "GET",
          "/v1/sandboxes",
          undefined,
          5_000,
        );
        await Promise.all(
          sandboxes.map((s) =>
            apiRequest(ep, "DELETE", `/v1/sandboxes/${s.id}`, undefined, 30_000).catch(() => undefined),
          ),
        );
      } catch {
        /* daemon already gone */
      }
      // The daemon and everything it started (VMMs, and any ip/nft/nsenter still running).
      const started = d.proc.pid === undefined ? [] : await descendants(d.proc.pid);
      await d.kill9();
      for (const pid of started) killQuietly(pid);
      // Belt and braces: no VM of this data dir may outlive the test (re-adopted VMMs are
      // not the daemon's descendants).
      await promisify(execFile)("pkill", ["-9", "-f", dataDir]).catch(() => undefined);
      await waitGone(started, 15_000);
      // Its network slots (namespaces, interfaces, host rules), left for a next daemon otherwise.
      if (process.getuid?.() === 0) {
        let left: string[] = [];
        for (let i = 0; i < 3; i++) {
          await teardownInstance(instanceOf(netId, 1, {})).catch(() => undefined);
          left = (await instanceState(netId)).filter((n) => !netBefore.has(n));
          if (left.length === 0) break;
          await new Promise((r) => setTimeout(r, 1_000));
        }
        if (left.length > 0)
          throw new Error(`the daemon of ${dataDir} left network state: ${left.join(", ")}`);
      }
      if (keep) process.stderr.write(`test artefacts kept in ${dataDir}\n`);
      else await rm(dataDir, { recursive: true, force: true });
    },
  };
  try {
    await d.start();
  } catch (e) {
    // A daemon that did not come up is still stopped and cleaned up (its log kept).
    await d.destroy(true).catch(() => undefined);
    throw e;
  }
  return d;
}

function killQuietly(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    /* gone already */
  }
}

async function waitGone(pids: number[], timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (pids.some(isAlive) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
}

/** Runs the CLI against the test daemon; resolves with its exit code and output. */
export function cli(
  d: TestDaemon,
  args: string[],
  timeoutMs = 600_000,
  input?: string,
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      [CLI, ...args],
      { env: d.env, timeout: timeoutMs, maxBuffer: 64 << 20 },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === "number" ? err.code : 1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
    child.stdin?.end(input ?? "");
  });
}
