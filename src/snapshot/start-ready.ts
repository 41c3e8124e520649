/**
 * A snapshot's start and ready commands (like E2B's templates): start_cmd runs in the
 * background in the parent (its own session, output to a log in the guest's /tmp), then
 * ready_cmd is run again and again until it exits 0, all before the warm-up and the freeze, so
 * whatever start_cmd started (a server) is already up in every child. Bounded by a timeout; a
 * failure says why with the outputs of both.
 */
import type { AgentClient } from "../agent/index.js";
import { ForkdError, errorMessage } from "../util/index.js";
import { sleep } from "../util/index.js";

/** In the guest: start_cmd's output, and its exit status once it ends. */
export const START_LOG = "/tmp/.forkd-start.log";
export const START_EXIT = "/tmp/.forkd-start.exit";

export interface StartReady {
  startCmd?: string | null;
  readyCmd?: string | null;
  /** How long ready_cmd has to succeed, from when start_cmd was started. */
  readyTimeoutMs: number;
  /** Env and cwd of both (the image's config; absent: the agent's defaults). */
  env?: Record<string, string>;
  cwd?: string;
}

/** How long one run of ready_cmd may take, and the pause between runs. */
const PROBE_TIMEOUT_MS = 30_000;
const PROBE_INTERVAL_MS = 250;
const TAIL = 2000;

/** A shell word for `s` (single-quoted). */
export const shellQuote = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;

/**
 * The shell line that starts `cmd` in the background: in a session of its own where the image
 * has setsid, stdin from /dev/null, output to START_LOG, its exit status to START_EXIT.
 */
export function startLine(cmd: string): string {
  const inner = `/bin/sh -c ${shellQuote(cmd)}; echo $? >${START_EXIT}`;
  return (
    `rm -f ${START_EXIT}; if command -v setsid >/dev/null 2>&1; then s=setsid; else s=; fi; ` +
    `$s /bin/sh -c ${shellQuote(inner)} </dev/null >${START_LOG} 2>&1 &`
  );
}

type Report = (line: string) => void;

async function run(
  agent: AgentClient,
  shell: string,
  o: StartReady,
  timeoutMs: number,
): Promise<{ code: number | null; timedOut: boolean; out: string }> {
  const out: Buffer[] = [];
  let size = 0;
  const keep = (d: Buffer) => {
    out.push(d);
    size += d.length;
    while (size > 64 * 1024 && out.length > 1) size -= out.shift()!.length;
  };
  const r = await agent.exec(
    { shell, timeoutMs, ...(o.env ? { env: o.env } : {}), ...(o.cwd ? { cwd: o.cwd } : {}) },
    { onStdout: keep, onStderr: keep },
  ).result;
  return { code: r.exitCode, timedOut: r.timedOut, out: Buffer.concat(out).toString("utf8").slice(-TAIL) };
}

/** What start_cmd wrote so far, and its exit status if it ended (null: still running). */
async function startState(agent: AgentClient): Promise<{ log: string; exit: number | null }> {
  const read = (p: string, max: number) =>
    agent
      .readFile(p, { maxBytes: max, timeoutMs: 10_000 })
      .then((b) => b.toString("utf8"))
      .catch(() => null);
  const [log, exit] = await Promise.all([read(START_LOG, 1 << 20), read(START_EXIT, 64)]);
  const n = exit === null ? NaN : Number.parseInt(exit.trim(), 10);
  return { log: (log ?? "").slice(-TAIL), exit: Number.isFinite(n) ? n : null };
}

/** Runs start_cmd and waits for ready_cmd as `o` says (each optional). */
export async function startAndWaitReady(agent: AgentClient, o: StartReady, report: Report): Promise<void> {
  const deadline = Date.now() + o.readyTimeoutMs;
  if (o.startCmd) {
    report(`start: ${o.startCmd}`);
    const r = await run(agent, startLine(o.startCmd), o, 30_000);
    if (r.code !== 0) {
      throw new ForkdError(
        "guest_error",
        `start command could not be started (${r.timedOut ? "timed out" : `exit ${r.code}`}): ${r.out}`,
      );
    }
  }
  if (!o.readyCmd) return;
  report(`ready: waiting for ${o.readyCmd}`);
  let last = "";
  let runs = 0;
  for (;;) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    runs++;
    try {
      const r = await run(agent, o.readyCmd, o, Math.min(PROBE_TIMEOUT_MS, left));
      if (r.code === 0) {
        report(`ready: ${o.readyCmd} succeeded (run ${runs})`);
        return;
      }
      last = `${r.timedOut ? "timed out" : `exit ${r.code}`}: ${r.out}`;
    } catch (e) {
      last = errorMessage(e);
      if (agent.closed) throw e;
    }
    if (o.startCmd) {
      const s = await startState(agent);
      if (s.exit !== null && s.exit !== 0) {
        throw new ForkdError(
          "guest_error",
          `start command exited with ${s.exit} before the ready command succeeded; its output: ${s.log}`,
          { start_output: s.log, ready_output: last },
        );
      }
    }
    await sleep(Math.min(PROBE_INTERVAL_MS, Math.max(0, deadline - Date.now())));
  }
  const s = o.startCmd ? await startState(agent) : { log: "", exit: null };
  throw new ForkdError(
    "timeout",
    `ready command did not succeed within ${o.readyTimeoutMs} ms (${runs} runs; last: ${last.trim()})` +
      (o.startCmd
        ? `; start command ${s.exit === null ? "still running" : `exited with ${s.exit}`}, its output: ${s.log.trim()}`
        : ""),
    { ready_output: last, ...(o.startCmd ? { start_output: s.log } : {}) },
  );
}
