/**
 * The QEMU command line, in one place: parents and children must present the same machine and
 * devices or the device state will not load. Only memory mapping, boot and incoming differ.
 */
import type { VmLimits } from "../host/index.js";
import { join } from "node:path";
import type { Accel } from "./accel.js";
import type { NetBackend } from "../net/index.js";
import type { GuestNet } from "../net/index.js";
import { guestSubnet } from "../net/index.js";

export interface MachineConfig {
  memoryMiB: number;
  vcpus: number;
  accel: Accel;
  /** QEMU CPU model; parents and children must match. */
  cpu: string;
}

/**
 * The default CPU model. Under TCG, `max` makes every guest context switch save and restore a
 * large emulated vector state and steers the guest's crypto and libraries to wide-vector code
 * that TCG emulates slowly; x86-64-v2 features are enough for Debian's userland and numpy.
 * A named Intel model rather than qemu64 with added flags: qemu64 says "AMD family 15", so
 * OpenBLAS (numpy's BLAS once matplotlib is installed) picks its Opteron kernels, which use
 * AMD-only instructions TCG does not emulate, and every matrix product dies with SIGILL.
 * ARAT lets the idle guest stop its tick (without it each idle child burns ~9% of a core).
 */
export function defaultCpu(accel: Accel, env: NodeJS.ProcessEnv = process.env): string {
  if (env.FORKD_CPU) return env.FORKD_CPU;
  return accel === "kvm" ? "host" : "Nehalem-v1,+arat";
}

/** The descriptor forkd-jailer hands a tap to the VMM on (native/jailer: TAP_FD). */
export const TAP_FD = 3;

/** The id of the guest NIC's netdev (QMP set_link names it). */
export const NETDEV_ID = "n0";

export interface VmLaunch {
  /** Directory for this VM's sockets and logs. */
  dir: string;
  machine: MachineConfig;
  /** Guest RAM file. `parent`: shared, writable (it becomes the image). `child`: private, read-only. */
  memory: { path: string; mode: "parent" | "child" };
  /** The VM's own writable qcow2 layer. */
  disk: string;
  /** Cold boot (parents only). */
  boot?: { kernel: string; initrd: string; append: string };
  /** Start waiting for device state (children only; see QemuVm.restoreState). Stays paused until resumed. */
  incoming?: boolean;
  /** TCG translation-buffer size; the largest part of a TCG child's private memory. */
  tbSizeMiB?: number;
  /**
   * The state to load was written by xen-save-devices-state (a BRANCH), which has no
   * configuration section: the incoming side must not expect one.
   */
  devicesOnlyState?: boolean;
  /**
   * Run jailed (when the driver has a jail): only `dir` (read-write) and `reads` (its snapshot
   * chain and guest image, read-only) visible, its own uid, and these host-side limits.
   */
  jail?: { reads: string[]; limits: VmLimits };
  /** A network device (absent: none, as in snapshots made before networking). */
  nic?: { guest: GuestNet; backend: NetBackend };
  /** A network namespace (/run/netns/NAME) the VMM starts in (needs the jailer). */
  netns?: string;
}

export const vmFiles = (dir: string) => ({
  qmp: join(dir, "qmp.sock"),
  agent: join(dir, "agent.sock"),
  console: join(dir, "console.log"),
  log: join(dir, "qemu.log"),
});

/** QEMU options are comma-separated; a comma in a value is written twice. */
const esc = (v: string): string => v.replaceAll(",", ",,");

export function qemuArgs(l: VmLaunch): string[] {
  const f = vmFiles(l.dir);
  const { memoryMiB, vcpus, accel } = l.machine;
  const mem =
    l.memory.mode === "parent"
      ? `memory-backend-file,id=mem,size=${memoryMiB}M,mem-path=${esc(l.memory.path)},share=on`
      : `memory-backend-file,id=mem,size=${memoryMiB}M,mem-path=${esc(l.memory.path)},share=off,readonly=on,rom=off`;
  const args = [
    "-name",
    `forkd,process=forkd-vm`,
    "-M",
    // No legacy PIT, PIC or RTC: the guest uses the LAPIC timer and the IOAPIC, and gets its
    // wall clock from the agent. Besides a faster start, an idle TCG child then costs ~0.5% of a
    // host core instead of ~1.4% (QEMU's timers for those devices).
    "microvm,memory-backend=mem,pit=off,pic=off,rtc=off",
    "-accel",
    accel === "tcg" ? `tcg,tb-size=${l.tbSizeMiB ?? 64}` : "kvm",
    "-cpu",
    l.machine.cpu,
    "-m",
    `${memoryMiB}M`,
    "-smp",
    String(vcpus),
    "-object",
    mem,
    "-nodefaults",
    // QEMU's own seccomp filter: no obsolete system calls, no set*id/capabilities, no fork or
    // exec, no scheduler or memory-policy changes; a compromised VMM keeps only what it needs.
    // (FORKD_QEMU_SECCOMP=off is for debugging only.)
    "-sandbox",
    process.env.FORKD_QEMU_SECCOMP === "off"
      ? "off"
      : "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    "-no-user-config",
    "-display",
    "none",
    "-no-reboot",
    "-chardev",
    `file,id=con,path=${esc(f.console)}`,
    "-serial",
    "chardev:con",
    "-device",
    "virtio-serial-device",
    "-chardev",
    `socket,id=agent,path=${esc(f.agent)},server=on,wait=off`,
    "-device",
    "virtserialport,chardev=agent,name=forkd.agent",
    "-drive",
    `file=${esc(l.disk)},if=none,id=d0,format=qcow2,cache=writeback`,
    "-device",
    "virtio-blk-device,drive=d0",
    "-qmp",
    `unix:${esc(f.qmp)},server=on,wait=off`,
  ];
  if (l.nic) args.push("-netdev", netdevArg(l.nic.guest, l.nic.backend), "-device", nicArg(l.nic.guest));
  if (l.boot) args.push("-kernel", l.boot.kernel, "-initrd", l.boot.initrd, "-append", l.boot.append);
  if (l.incoming) {
    // The stream is loaded over QMP (restoreState): x-ignore-shared must be set first.
    args.push("-S", "-incoming", "defer");
    // No self-announcement after the load. It exists for live migration (tell the switches where
    // the MAC went); with the guest-announce feature the guest driver does it itself: a config
    // interrupt right after resume, netdev_notify_peers and a control-queue ack in a guest worker,
    // for nothing (every child's backend is new, and with the link down the frames are dropped).
    // Under TCG that was most of the "+20 ms since every snapshot got a NIC" (docs/architecture.md).
    args.push("-global", "migration.announce-rounds=0");
    if (l.devicesOnlyState) args.push("-global", "migration.send-configuration=off");
  }
  return args;
}

export const nicArg = (g: GuestNet): string => `virtio-net-device,netdev=${NETDEV_ID},mac=${g.mac}`;

export function netdevArg(g: GuestNet, b: NetBackend): string {
  switch (b.kind) {
    case "none":
      return `hubport,id=${NETDEV_ID},hubid=0`;
    case "tap":
      // Opened by the jailer (forkd-jailer --tap) and inherited as this descriptor.
      return `tap,id=${NETDEV_ID},fd=${TAP_FD},vhost=off`;
    case "user": {
      const parts = [
        `user,id=${NETDEV_ID}`,
        `net=${guestSubnet(g)}`,
        `host=${g.gateway}`,
        `dns=${g.dns}`,
        "ipv6=off",
        `restrict=${b.restrict ? "on" : "off"}`,
        ...b.forwards.map((f) => `hostfwd=tcp:${f.hostAddr}:${f.hostPort}-${g.addr}:${f.guestPort}`),
      ];
      return parts.join(",");
    }
  }
}

/**
 * Whether the guest kernel keeps its CPU-vulnerability mitigations (`FORKD_GUEST_MITIGATIONS`:
 * `on`, `off`, or `auto`). `auto` turns them off under TCG only: TCG does not execute
 * speculatively, so Meltdown/Spectre have nothing to leak there, while KPTI's page-table switch
 * on every system call costs a TCG TLB flush (it doubled the exec round trip, bench/RESULTS.md).
 * Under KVM the guest runs on real hardware and keeps them.
 */
export function guestMitigations(accel: Accel, env: NodeJS.ProcessEnv = process.env): boolean {
  const v = env.FORKD_GUEST_MITIGATIONS ?? "auto";
  if (v === "on") return true;
  if (v === "off") return false;
  if (v !== "auto")
    throw new Error(`FORKD_GUEST_MITIGATIONS must be on, off or auto (got ${JSON.stringify(v)})`);
  return accel !== "tcg";
}

/** The guest kernel command line (`extra`: options for the guest's agent, e.g. forkd.net=). */
export function kernelCmdline(
  accel: Accel,
  tscKhz: number,
  env: NodeJS.ProcessEnv = process.env,
  extra: string[] = [],
): string {
  const parts = [
    "console=ttyS0",
    "root=/dev/vda",
    "rw",
    "quiet",
    "panic=-1",
    "random.trust_cpu=on",
    ...extra,
  ];
  // Under TCG the microvm guest hangs at "Marking TSC unstable" without an early TSC frequency.
  // Under TCG the guest's clocksource watchdog sees the emulated TSC skew against jiffies while
  // the VM is slow (booting, or 100 children starting at once), marks it unstable, and falls
  // back to jiffies, which needs a 250 Hz tick forever: ~9% of a host core per idle child.
  if (accel === "tcg") parts.push(`tsc_early_khz=${tscKhz}`, "tsc=reliable");
  // The soft-lockup watchdog's periodic timer wakes every idle child; a VM has a host to watch it.
  parts.push("nowatchdog");
  if (!guestMitigations(accel, env)) parts.push("mitigations=off");
  return parts.join(" ");
}
