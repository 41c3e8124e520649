/** Which QEMU binary runs VMs, and its version. */
import { access, constants } from "node:fs/promises";
import type { Accel } from "./accel.js";
import { run } from "../util/index.js";

async function executable(p: string): Promise<boolean> {
  try {
    await access(p, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * FORKD_QEMU if set. Otherwise, for KVM, Debian's microvm-only build (starts ~3x faster); it has
 * no TCG, so TCG (and the accelerator probe, accel undefined) use the full x86_64 build.
 */
export async function findQemu(env: NodeJS.ProcessEnv = process.env, accel?: Accel): Promise<string> {
  if (env.FORKD_QEMU) return env.FORKD_QEMU;
  if (accel === "kvm" && (await executable("/usr/bin/qemu-system-x86_64-microvm"))) {
    return "/usr/bin/qemu-system-x86_64-microvm";
  }
  return (await executable("/usr/bin/qemu-system-x86_64"))
    ? "/usr/bin/qemu-system-x86_64"
    : "qemu-system-x86_64";
}

export async function qemuVersion(binary: string): Promise<string> {
  const { stdout } = await run(binary, ["--version"], { timeoutMs: 10_000 });
  return /version ([\d.]+)/.exec(stdout)?.[1] ?? "unknown";
}
