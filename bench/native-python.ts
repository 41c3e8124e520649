/**
 * The native baseline of a code-interpreter request: a fresh `python3 -c` process running the
 * same cell, in its own namespaces (pid, mount with its own /proc, net, uts, ipc), timed from
 * spawn to exit.
 */
import { spawn } from "node:child_process";

export const NAMESPACES = ["--fork", "--pid", "--mount-proc", "--net", "--uts", "--ipc"];

/**
 * The program a native process runs for `cell`: numpy imported as the warm kernel has it, the
 * cell's statements, and its last line (an expression) printed.
 */
export function nativeProgram(cell: string, prelude: string): string {
  const lines = cell.trimEnd().split("\n");
  const last = lines.pop() ?? "None";
  return [prelude, ...lines, `print(${last})`].join("\n");
}

export interface NativeRun {
  ms: number;
  stdout: string;
}

/** Runs `python3 -c program` under `unshare` with NAMESPACES; rejects unless it exits 0 (60 s at most). */
export function runNative(program: string): Promise<NativeRun> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const p = spawn("unshare", [...NAMESPACES, "python3", "-c", program], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", LANG: "C.UTF-8" },
    });
    let out = "";
    let err = "";
    p.stdout.on("data", (b: Buffer) => (out += b.toString()));
    p.stderr.on("data", (b: Buffer) => (err += b.toString()));
    const timer = setTimeout(() => p.kill("SIGKILL"), 60_000);
    p.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    p.on("close", (code, signal) => {
      clearTimeout(timer);
      const ms = performance.now() - t0;
      if (code === 0) resolve({ ms, stdout: out.trim() });
      else reject(new Error(`native python3 exited ${code ?? signal}: ${err.trim().slice(-500)}`));
    });
  });
}
