/** Host prerequisite checks, each with a fix hint. Used by `forkd doctor`. */
import { readdir, readFile, statfs } from "node:fs/promises";
import { join } from "node:path";
import type { Paths } from "../host/index.js";
import { chooseAccel } from "./accel.js";
import { findJailer, findMemsnap, NATIVE_FIX } from "../host/index.js";
import { findQemu, qemuVersion } from "./qemu-binary.js";
import { run } from "../util/index.js";
import { asRoot } from "../util/index.js";
import { errorMessage } from "../util/index.js";
import { detectNetwork } from "../net/index.js";

export type CheckStatus = "ok" | "warn" | "fail";

export interface Check {
  name: string;
  status: CheckStatus;
  detail: string;
  fix?: string;
}

/** Installs the host's packages (as root: `su -c` when the doctor is not, no sudo assumed). */
const SETUP = `run: ${asRoot("bash scripts/setup-host.sh")}`;

async function have(cmd: string): Promise<boolean> {
  try {
    await run("sh", ["-c", `command -v ${cmd}`]);
    return true;
  } catch {
    return false;
  }
}

async function freeGiB(path: string): Promise<number> {
  const s = await statfs(path);
  return (s.bavail * s.bsize) / 2 ** 30;
}

export async function runChecks(paths: Paths): Promise<Check[]> {
  const checks: Check[] = [];
  const add = (c: Check) => checks.push(c);

  const qemu = await findQemu();
  try {
    const v = await qemuVersion(qemu);
    const [maj = 0, min = 0] = v.split(".").map(Number);
    const ok = maj > 8 || (maj === 8 && min >= 2);
    add({
      name: "qemu",
      status: ok ? "ok" : "fail",
      detail: `${qemu} ${v}`,
      fix: ok ? undefined : `QEMU >= 8.2 needed (readonly memory backends, file: migration); ${SETUP}`,
    });
  } catch (e) {
    add({ name: "qemu", status: "fail", detail: errorMessage(e), fix: SETUP });
  }
  for (const [name, find] of [
    ["jailer", findJailer],
    ["memsnap", findMemsnap],
  ] as const) {
    try {
      add({ name, status: "ok", detail: await find() });
    } catch (e) {
      add({ name, status: "fail", detail: errorMessage(e), fix: NATIVE_FIX });
    }
  }
  for (const tool of ["qemu-img", "e2fsck", "debootstrap", "mkfs.ext4", "cpio", "gcc"]) {
    const ok = await have(tool);
    add({
      name: tool,
      status: ok ? "ok" : "fail",
      detail: ok ? "found" : "missing",
      fix: ok ? undefined : SETUP,
    });
  }
  try {
    const a = await chooseAccel(qemu);
    add({
      name: "accelerator",
      status: a.accel === "kvm" || a.forced ? "ok" : "warn",
      detail: `${a.accel}: ${a.reason}`,
      fix:
        a.accel === "tcg" && !a.forced
          ? "guests run under TCG (slow); use a host with vmx/svm and /dev/kvm for KVM, or set FORKD_ACCEL=tcg to silence"
          : undefined,
    });
  } catch (e) {
    add({
      name: "accelerator",
      status: "fail",
      detail: errorMessage(e),
      fix: "set FORKD_ACCEL to kvm or tcg",
    });
  }
  for (const [name, path, min] of [
    ["data dir space", paths.dataDir, 4],
    ["/dev/shm space", "/dev/shm", 1],
  ] as const) {
    try {
      const gib = await freeGiB(path).catch(() => freeGiB("/"));
      add({
        name,
        status: gib >= min ? "ok" : "fail",
        detail: `${gib.toFixed(1)} GiB free at ${path}`,
        fix: gib >= min ? undefined : `free at least ${min} GiB`,
      });
    } catch (e) {
      add({ name, status: "fail", detail: errorMessage(e) });
    }
  }
  try {
    const mounts = await readFile("/proc/mounts", "utf8");
    const v2 = /\scgroup2\s/.test(mounts);
    const v1 = (mounts.match(/\scgroup\s/g) ?? []).length;
    let v2ctl = "";
    if (v2) {
      const root =
        mounts
          .split("\n")
          .find((l) => l.split(" ")[2] === "cgroup2")
          ?.split(" ")[1] ?? "/sys/fs/cgroup";
      v2ctl = (await readFile(join(root, "cgroup.controllers"), "utf8").catch(() => "")).trim();
    }
    add({
      name: "cgroups",
      status: v2ctl || v1 > 0 ? "ok" : "warn",
      detail: `v2: ${v2 ? `mounted, controllers [${v2ctl}]` : "absent"}; v1 controller mounts: ${v1}`,
      fix: v2ctl || v1 > 0 ? undefined : "no cgroup controllers: per-sandbox resource limits unavailable",
    });
  } catch (e) {
    add({ name: "cgroups", status: "warn", detail: errorMessage(e) });
  }
  // The VMM jail (src/vmm/jail.ts): a uid per VMM and a mount namespace need root; host tools on
  // guests' disks (src/vmm/jailed-tools.ts) also get PID and network namespaces of their own.
  const root = process.getuid?.() === 0;
  const ns =
    root &&
    (await run("unshare", ["-m", "-p", "-n", "-f", "true"]).then(
      () => true,
      () => false,
    ));
  add({
    name: "vmm jail",
    status: root && ns && process.env.FORKD_JAIL !== "off" ? "ok" : "warn",
    detail: !root
      ? "the daemon would not be root: VMMs run as its user, without a uid or mount namespace of their own"
      : ns
        ? process.env.FORKD_JAIL === "off"
          ? "disabled by FORKD_JAIL=off"
          : "a uid, mount namespace, cgroup and seccomp filter per VMM; qemu-img and e2fsck on guests' disks jailed too"
        : "cannot create mount, PID and network namespaces",
    fix: root && ns ? undefined : "run the daemon as root to jail each VMM and host tool",
  });
  const images = await readdir(join(paths.cacheDir, "images")).catch(() => [] as string[]);
  add({
    name: "guest image",
    status: images.length > 0 ? "ok" : "warn",
    detail: images.length > 0 ? `${images.length} built under ${paths.cacheDir}/images` : "not built yet",
    fix:
      images.length > 0
        ? undefined
        : "built automatically by the first `forkd snapshot` (needs root for debootstrap)",
  });
  try {
    const jailer = await findJailer().catch(() => null);
    const net = await detectNetwork({ qemuBinary: qemu, jailer });
    add({
      name: "network: user",
      status: net.user.ok ? "ok" : "warn",
      detail: net.user.reason,
      fix: net.user.ok ? undefined : "install Debian's qemu-system-x86 (its full build has slirp)",
    });
    add({
      name: "network: netns",
      status: net.netns.ok ? "ok" : "warn",
      detail: net.netns.reason,
      fix: net.netns.fix,
    });
    add({
      name: "network: dns",
      status: net.dns.ok ? "ok" : "warn",
      detail: net.dns.reason,
      fix: net.dns.ok ? undefined : "point /etc/resolv.conf at a non-loopback resolver for netns children",
    });
  } catch (e) {
    add({ name: "network", status: "warn", detail: errorMessage(e) });
  }
  return checks;
}
