/**
 * A native helper (forkd-memsnap) that answers on stdout one JSON line per step: started with
 * the daemon's child environment, its stderr kept (bounded) for the error it fails with, every
 * wait for a line bounded, and SIGKILL to end it. Used by the stopped capture (memsnap.ts) and
 * the live one (live-capture.ts).
 */
import { spawn } from "node:child_process";
import type { ChildProcessWithoutNullStreams } from "node:child_process";
import { createInterface } from "node:readline";
import { ForkdError } from "../util/index.js";
import { childEnv } from "../util/index.js";

export interface JsonHelper {
  child: ChildProcessWithoutNullStreams;
  /** Resolves with its exit code once it has exited. */
  exited: Promise<number | null>;
  /** The error for step `what`, with the helper's own words (waits up to 1 s for it to exit). */
  failure: (what: string) => Promise<ForkdError>;
  /** Its next JSON line; a closed stdout is `failure(what)`, no line within `timeoutMs` a timeout. */
  nextJson: <T>(what: string, timeoutMs: number) => Promise<T>;
  kill: () => void;
}

export function spawnJsonHelper(binary: string, args: string[], label: string): JsonHelper {
  const child = spawn(binary, args, { stdio: ["pipe", "pipe", "pipe"], env: childEnv() });
  let stderr = "";
  // A helper that cannot start (ENOENT, EACCES) or dies before reading its input (EPIPE) fails
  // through its closed stdout below; unheard, these events would end the daemon.
  child.on("error", (e) => {
    if (stderr === "") stderr = e.message;
  });
  child.stdin.on("error", () => undefined);
  child.stderr.on("data", (c: Buffer) => {
    if (stderr.length < 4096) stderr += c.toString("utf8");
  });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const exited = new Promise<number | null>((resolve) => child.once("close", (code) => resolve(code)));
  const failure = async (what: string) => {
    // Give it a moment to exit, so its own words are in stderr.
    await Promise.race([exited, new Promise((r) => setTimeout(r, 1000))]);
    return new ForkdError("vmm_error", `${label} ${what} failed: ${stderr.trim() || "no output"}`);
  };
  const nextJson = async <T>(what: string, timeoutMs: number): Promise<T> => {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new ForkdError("timeout", `${label} ${what}: no answer in ${timeoutMs} ms`)),
        timeoutMs,
      );
    });
    try {
      const r = await Promise.race([lines.next(), timeout]);
      if (r.done) throw await failure(what);
      return JSON.parse(r.value) as T;
    } finally {
      clearTimeout(timer);
    }
  };
  const kill = () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  };
  return { child, exited, failure, nextJson, kill };
}
