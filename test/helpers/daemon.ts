/**
 * Integration-test harness: a real daemon in its own process (so it can be SIGKILLed and
 * restarted), on a throwaway data dir, sharing the guest image cache. On failure, the daemon
 * log and VM consoles are kept and their path printed.
 */
import { spawn, execFile } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { mkdtemp, open, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { apiRequest } from "../../src/client/http.js";
import type { Endpoint } from "../../src/client/http.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { teardownInstance } from "../../src/net/pool.js";
import { instanceId, instanceOf } from "../../src/net/slots.js";

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
      if (d.proc.exitCode === null) await d.kill9();
      // Belt and braces: no VM of this data dir may outlive the test.
      await promisify(execFile)("pkill", ["-9", "-f", dataDir]).catch(() => undefined);
      // Its network slots (namespaces, interfaces, host rules), left for a next daemon otherwise.
      if (process.getuid?.() === 0) {
        await teardownInstance(instanceOf(instanceId(dataDir, env), 1, {})).catch(() => undefined);
      }
      if (keep) process.stderr.write(`test artefacts kept in ${dataDir}\n`);
      else await rm(dataDir, { recursive: true, force: true });
    },
  };
  await d.start();
  return d;
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
