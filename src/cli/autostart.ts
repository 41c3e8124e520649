/** The CLI starts a local daemon when none answers, so one command works on a fresh machine. */
import { spawn } from "node:child_process";
import { mkdir, open } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { ApiClient } from "@forkd/sdk";
import type { Paths } from "../host/index.js";
import { sleep } from "../util/index.js";
import { VERSION } from "../host/index.js";
import { daemonHoldsLock } from "../host/index.js";

async function answers(api: ApiClient): Promise<boolean> {
  try {
    await api.health({ timeoutMs: 2_000 });
    return true;
  } catch {
    return false;
  }
}

/**
 * Makes sure a daemon answers on the local socket, starting one if none holds the data
 * directory. The caller calls it once per run (CliContext.ready()).
 */
export async function ensureDaemon(api: ApiClient, paths: Paths, say: (s: string) => void): Promise<void> {
  if (await answers(api)) {
    const v = await api.version({ timeoutMs: 2_000 }).catch(() => null);
    if (v && v.version !== VERSION) {
      say(
        `forkd: warning: the running daemon is version ${v.version}, this CLI is ${VERSION}; restart the daemon to upgrade it`,
      );
    }
    return;
  }
  const logPath = join(paths.dataDir, "daemon.log");
  if (await daemonHoldsLock(paths.dataDir)) {
    // A daemon is running but busy or still starting: wait for it, never start a second one.
    say("forkd: the daemon is busy or starting; waiting for it");
    const deadline = Date.now() + 120_000;
    while (Date.now() < deadline) {
      if (await answers(api)) return;
      await sleep(250);
    }
    throw new Error(`the daemon holding ${paths.dataDir} does not answer; see ${logPath}`);
  }
  await mkdir(paths.dataDir, { recursive: true, mode: 0o700 });
  say(`forkd: starting a local daemon (log: ${logPath})`);
  const log = await open(logPath, "a", 0o600);
  const main = join(dirname(fileURLToPath(import.meta.url)), "main.js");
  // The one child given the whole environment: the daemon's configuration is its environment.
  const child = spawn(process.execPath, [main, "daemon"], {
    detached: true,
    stdio: ["ignore", log.fd, log.fd],
    env: process.env,
  });
  await log.close();
  child.unref();
  const state: { exited: number | null } = { exited: null };
  child.once("exit", (code) => (state.exited = code ?? 1));
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (await answers(api)) return;
    if (state.exited !== null) throw new Error(`the daemon exited (code ${state.exited}); see ${logPath}`);
    await sleep(100);
  }
  throw new Error(`the daemon did not answer within 60 s; see ${logPath}`);
}
