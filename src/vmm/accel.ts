/**
 * Accelerator choice. KVM only where the CPU has hardware virtualization (vmx/svm), /dev/kvm
 * opens, and a short probe VM runs on it; otherwise TCG with a visible reason. FORKD_ACCEL
 * forces either. (kvm-pvm hosts have a /dev/kvm that creates VMs but cannot run stock guests:
 * the CPU-flag check is what rules them out.)
 */
import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { access, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ForkdError, errorMessage } from "../util/index.js";
import { childEnv } from "../util/index.js";
import { QmpClient } from "./qmp.js";
import { sleep } from "../util/index.js";

export type Accel = "kvm" | "tcg";

export interface AccelChoice {
  accel: Accel;
  forced: boolean;
  reason: string;
  /** Host TSC frequency for the guest command line (TCG needs tsc_early_khz). */
  tscKhz: number;
}

export async function hostTscKhz(): Promise<number> {
  const info = await readFile("/proc/cpuinfo", "utf8");
  const m = /^cpu MHz\s*:\s*([\d.]+)/m.exec(info);
  return m ? Math.round(Number(m[1]) * 1000) : 2_000_000;
}

async function cpuHasVirt(): Promise<boolean> {
  const info = await readFile("/proc/cpuinfo", "utf8");
  return /^flags\s*:.*\b(vmx|svm)\b/m.test(info);
}

/** Starts QEMU on KVM paused, asks QMP whether KVM is enabled, lets it run briefly. */
async function probeKvm(qemu: string): Promise<string | null> {
  const dir = await mkdtemp(join(tmpdir(), "forkd-kvm-probe-"));
  const qmpPath = join(dir, "qmp.sock");
  const child = spawn(
    qemu,
    [
      "-M",
      "microvm",
      "-accel",
      "kvm",
      "-cpu",
      "host",
      "-m",
      "64M",
      "-nodefaults",
      "-no-user-config",
      "-display",
      "none",
      "-S",
      "-qmp",
      `unix:${qmpPath},server=on,wait=off`,
    ],
    { stdio: ["ignore", "ignore", "pipe"], env: childEnv() },
  );
  let stderr = "";
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()).slice(0, 4096));
  try {
    const qmp = await QmpClient.connect(qmpPath, 5_000);
    const kvm = await qmp.execute<{ enabled: boolean; present: boolean }>("query-kvm");
    if (!kvm.enabled) return "QEMU reports KVM not enabled";
    await qmp.execute("cont");
    await sleep(300);
    const st = await qmp.execute<{ status: string }>("query-status");
    qmp.close();
    if (st.status === "internal-error" || st.status === "guest-panicked")
      return `probe VM stopped: ${st.status}`;
    return null;
  } catch (e) {
    return `probe failed: ${errorMessage(e)} ${stderr.trim()}`.trim();
  } finally {
    child.kill("SIGKILL");
    await rm(dir, { recursive: true, force: true });
  }
}

export async function chooseAccel(qemu: string, env: NodeJS.ProcessEnv = process.env): Promise<AccelChoice> {
  const tscKhz = await hostTscKhz();
  const forced = env.FORKD_ACCEL;
  if (forced !== undefined && forced !== "") {
    if (forced !== "kvm" && forced !== "tcg") {
      throw new ForkdError(
        "invalid_argument",
        `FORKD_ACCEL must be kvm or tcg, not ${JSON.stringify(forced)}`,
      );
    }
    return { accel: forced, forced: true, reason: `forced by FORKD_ACCEL=${forced}`, tscKhz };
  }
  if (!(await cpuHasVirt())) {
    return {
      accel: "tcg",
      forced: false,
      reason: "CPU has no vmx/svm flag (no hardware virtualization)",
      tscKhz,
    };
  }
  try {
    await access("/dev/kvm", constants.R_OK | constants.W_OK);
  } catch {
    return { accel: "tcg", forced: false, reason: "/dev/kvm is missing or not accessible", tscKhz };
  }
  const failure = await probeKvm(qemu);
  if (failure) return { accel: "tcg", forced: false, reason: `KVM probe failed: ${failure}`, tscKhz };
  return {
    accel: "kvm",
    forced: false,
    reason: "hardware virtualization present and the KVM probe passed",
    tscKhz,
  };
}
