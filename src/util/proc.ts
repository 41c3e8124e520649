/**
 * Host processes: the environment a child gets, running tools with a deadline, and identifying
 * processes we did not spawn. Every spawn/execFile in src/ passes an explicit `env` (lint-checked:
 * eslint.config.js), childEnv(...) unless it must be otherwise.
 */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { ForkdError } from "./errors.js";

/** What every child may inherit from the daemon: what programs need to run, nothing of forkd's. */
export const CHILD_ENV_KEYS = ["PATH", "LANG", "LC_ALL", "TZ", "TMPDIR"] as const;
/** Proxy and TLS trust settings, for the children that download (guest image builds). */
export const DOWNLOAD_ENV_KEYS = [
  "http_proxy",
  "https_proxy",
  "no_proxy",
  "HTTP_PROXY",
  "HTTPS_PROXY",
  "NO_PROXY",
  "SSL_CERT_FILE",
  "SSL_CERT_DIR",
  "CURL_CA_BUNDLE",
];
const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/**
 * The environment of a process the daemon starts: CHILD_ENV_KEYS from `from` (PATH defaulted),
 * plus `extra` (what one program needs). Never the daemon's own environment: its FORKD_* settings
 * hold the admin token (FORKD_TOKEN) and registry credentials, and a jailed VMM's environment is
 * readable by anything that reaches its uid (/proc/PID/environ). A FORKD_ variable in `extra` is
 * refused: pass such a setting as an argument.
 */
export function childEnv(
  extra: Record<string, string> = {},
  from: NodeJS.ProcessEnv = process.env,
): Record<string, string> {
  const env: Record<string, string> = {};
  for (const k of CHILD_ENV_KEYS) {
    const v = from[k];
    if (v !== undefined) env[k] = v;
  }
  env.PATH ??= DEFAULT_PATH;
  for (const [k, v] of Object.entries(extra)) {
    if (/^FORKD_/i.test(k)) throw new ForkdError("internal", `${k} must not reach a child process`);
    env[k] = v;
  }
  return env;
}

/** The DOWNLOAD_ENV_KEYS set in `from` (for childEnv's `extra`). */
export function downloadEnv(from: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const env: Record<string, string> = {};
  for (const k of DOWNLOAD_ENV_KEYS) {
    const v = from[k];
    if (v !== undefined) env[k] = v;
  }
  return env;
}

export interface RunResult {
  stdout: string;
  stderr: string;
}

/**
 * Runs a program (no shell) and returns its output; a non-zero exit or timeout is an error.
 * `input` is written to its standard input (which is then closed). Its environment is childEnv()
 * unless `env` says otherwise.
 */
export function run(
  file: string,
  args: string[],
  opts: { timeoutMs?: number; cwd?: string; input?: string; env?: Record<string, string> } = {},
): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      file,
      args,
      {
        timeout: opts.timeoutMs ?? 60_000,
        maxBuffer: 16 << 20,
        cwd: opts.cwd,
        killSignal: "SIGKILL",
        env: opts.env ?? childEnv(),
      },
      (err, stdout, stderr) => {
        if (err) {
          reject(
            new ForkdError(
              "internal",
              `${file} ${args.join(" ")} failed: ${stderr.trim() || err.message}`,
              {
                file,
              },
              err,
            ),
          );
          return;
        }
        resolve({ stdout, stderr });
      },
    );
    child.stdin?.on("error", () => undefined); // a program that exits without reading its input
    child.stdin?.end(opts.input ?? "");
  });
}

/**
 * The start time of a process (field 22 of /proc/PID/stat, clock ticks since boot), or null if
 * it does not exist. A pid plus its start time names a process unambiguously: pids are reused.
 */
export async function processStartTime(pid: number): Promise<number | null> {
  let stat: string;
  try {
    stat = await readFile(`/proc/${pid}/stat`, "utf8");
  } catch {
    return null;
  }
  // comm (field 2) may contain spaces and parentheses: split after the last ')'.
  const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const state = rest[0];
  if (state === "Z" || state === "X") return null;
  const start = Number(rest[19]);
  return Number.isFinite(start) ? start : null;
}

export async function processCmdline(pid: number): Promise<string[]> {
  try {
    return (await readFile(`/proc/${pid}/cmdline`, "utf8")).split("\0").filter((s) => s.length > 0);
  } catch {
    return [];
  }
}

/** Whether `pid` runs (a zombie waiting to be reaped does not: it has exited). */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    return state !== "Z" && state !== "X";
  } catch {
    return false;
  }
}

/**
 * Pids of processes whose command line mentions `needle` (a VM's directory): finds VMMs left
 * without a record by a daemon that died between starting them and writing their record.
 */
export async function pidsReferencing(needle: string): Promise<number[]> {
  const pids: number[] = [];
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const pid = Number(name);
    if (pid === process.pid) continue;
    const cmd = await processCmdline(pid);
    if (cmd.some((a) => a.includes(needle))) pids.push(pid);
  }
  return pids;
}
