/**
 * flock(2) locks from Node, through flock(1) (util-linux, as guest/image/build.sh takes the
 * cache's lock): a child holds the lock until its stdin closes, so the lock goes with this
 * process however it ends (kill -9 included: the pipe closes, the child exits, the kernel drops
 * the lock). Waiting is bounded.
 */
import { spawn } from "node:child_process";
import { childEnv } from "../util/index.js";

export interface HeldLock {
  release(): Promise<void>;
}

/**
 * Takes the lock on `path` (created if missing): shared or exclusive, waiting at most `waitMs`
 * (0: not at all). Null when another holder kept it past the wait.
 */
export function takeFlock(path: string, o: { shared: boolean; waitMs: number }): Promise<HeldLock | null> {
  const wait = o.waitMs <= 0 ? ["-n"] : ["-w", String(Math.max(0.001, o.waitMs / 1000))];
  const child = spawn(
    "flock",
    [o.shared ? "-s" : "-x", ...wait, "-E", "75", path, "-c", "echo locked; exec cat >/dev/null"],
    { stdio: ["pipe", "pipe", "ignore"], env: childEnv() },
  );
  return new Promise<HeldLock | null>((resolve, reject) => {
    let settled = false;
    let out = "";
    const exited = new Promise<void>((r) => child.once("close", () => r()));
    // A guard beyond flock's own wait: it never hangs this process.
    const guard = setTimeout(() => child.kill("SIGKILL"), o.waitMs + 10_000);
    const done = (v: HeldLock | null, e?: Error) => {
      if (settled) return;
      settled = true;
      clearTimeout(guard);
      if (e) reject(e);
      else resolve(v);
    };
    child.stdin.on("error", () => undefined);
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
      if (!out.includes("locked")) return;
      done({
        release: async () => {
          child.stdin.end();
          const kill = setTimeout(() => child.kill("SIGKILL"), 5_000);
          await exited;
          clearTimeout(kill);
        },
      });
    });
    child.once("error", (e) => done(null, e));
    child.once("exit", (code) => {
      if (code === 75 || code === 1) done(null);
      else done(null, new Error(`flock ${path} exited with ${code ?? "a signal"} before locking`));
    });
  });
}
