/** Which QEMU binary runs VMs, and its version. */
import { access, constants } from "node:fs/promises";
import { run } from "../util/proc.js";

/** FORKD_QEMU, else the microvm-only build (starts ~3x faster), else the full x86_64 build. */
export async function findQemu(env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (env.FORKD_QEMU) return env.FORKD_QEMU;
  for (const p of ["/usr/bin/qemu-system-x86_64-microvm", "/usr/bin/qemu-system-x86_64"]) {
    try {
      await access(p, constants.X_OK);
      return p;
    } catch {
      /* next */
    }
  }
  return "qemu-system-x86_64";
}

export async function qemuVersion(binary: string): Promise<string> {
  const { stdout } = await run(binary, ["--version"], { timeoutMs: 10_000 });
  return /version ([\d.]+)/.exec(stdout)?.[1] ?? "unknown";
}
